"""The decision routes (`/v1/decisions`, `/v1/systemone`) and `/v1/score`, `/v1/rerank` through a real HTTP client
against the live tiny-Qwen3.5 server (real tokenizer and chat template, real CPU engine): the wire shapes, the
probabilities against an independent computation from Engine.score's full-vocabulary logprobs, a question alone
against the same question among fifty, the error table in each route's shape, and release on disconnect."""

from __future__ import annotations

import json
import math
import random

import httpx
import pytest
from live_servers import artifact_for, lanes_free_within, serve_model
from ninfer.decisions.contract import Question
from ninfer.decisions.prompt import (
    context_messages,
    labels_for,
    more_tokens_than,
    question_text,
    render_decision,
)

ROUTES = ("/v1/decisions", "/v1/systemone")
QUESTIONS = {
    "ok": {"type": "noul", "instructions": "Is the ticket about money?",
           "criteria": {"true": "billing", "false": "anything else"}},
    "team": {"type": "choice", "instructions": "Which team?",
             "criteria": {"billing": "payments", "tech": {"area": "bugs"}, "ship": None}},
    "mood": {"type": "score", "instructions": "How upset is the customer?", "criteria": ["calm", "upset", "angry"]},
}
STATE = {"ticket": "I was charged twice", "priority": 2}


def _post(server, path: str, body, **kw) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{server.url}{path}", content=content, headers={"Content-Type": "application/json"},
                      timeout=300, **kw)


def _independent(engine, state, q: dict) -> list[float]:
    """Label probabilities from full-vocabulary logprobs (Engine.score), renormalised over the labels."""
    question = Question("x", q["type"], q.get("instructions"), q.get("criteria"))
    labels = labels_for(question)
    rendered = render_decision(engine.frontend, context_messages(state, None), [(question_text(question, labels),
                                                                                 labels)])
    ids = rendered.context + rendered.questions[0].suffix
    full = [engine.score_sync([*ids, engine.frontend.encode(lab)[0]])[-1] for lab in labels.labels]
    top = max(full)
    weights = [math.exp(v - top) for v in full]
    return [w / math.fsum(weights) for w in weights]


@pytest.mark.parametrize("path", ROUTES)
def test_every_type_answers_in_the_contract_shape_with_independent_probabilities(qwen35_server, path):
    r = _post(qwen35_server, path, {"model": "jev-latest", "state": STATE, "questions": QUESTIONS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["model", "answers", "usage"] and body["model"] == qwen35_server.model_id
    assert list(body["answers"]) == list(QUESTIONS)
    assert body["usage"]["output_tokens"] == 0 and body["usage"]["input_tokens"] > 0
    noul, choice, score = (body["answers"][k] for k in QUESTIONS)
    assert list(noul) == ["type", "noul"]
    assert list(choice) == ["type", "choice", "confidence", "probabilities"]
    assert list(score) == ["type", "score", "confidence", "legend", "probabilities"]
    assert list(choice["probabilities"]) == ["billing", "tech", "ship"]
    assert score["legend"] == {"0": "calm", "1": "upset", "2": "angry"}
    engine = qwen35_server.engine
    for answer, q in zip((noul, choice, score), QUESTIONS.values(), strict=True):
        p = [answer["noul"], 1 - answer["noul"]] if q["type"] == "noul" else list(answer["probabilities"].values())
        assert math.fsum(p) == pytest.approx(1.0, abs=1e-6)
        assert p == pytest.approx(_independent(engine, STATE, q), abs=2e-4)
    pc = list(choice["probabilities"].values())
    assert choice["choice"] == list(QUESTIONS["team"]["criteria"])[pc.index(max(pc))]
    assert choice["confidence"] == pytest.approx((3 * math.fsum(x * x for x in pc) - 1) / 2, abs=1e-12)
    ps = list(score["probabilities"].values())
    assert score["score"] == pytest.approx(ps[1] + 2 * ps[2], abs=1e-12)
    m = ps.index(max(ps))
    assert score["confidence"] == pytest.approx(max(0.0, 1 - math.fsum(p * abs(i - m) for i, p in enumerate(ps))
                                                / (2 / 3)), abs=1e-12)


def test_a_question_alone_equals_the_same_question_among_fifty(qwen35_server):
    rng = random.Random()
    questions = {f"q{i}": {"type": "score", "instructions": f"Rate aspect {rng.randrange(10**6)}.",
                           "criteria": ["low", "mid", "high"]} for i in range(50)}
    together = _post(qwen35_server, "/v1/decisions", {"state": "a long day", "questions": questions}).json()
    for key in ("q0", "q31"):
        alone = _post(qwen35_server, "/v1/decisions", {"state": "a long day", "questions": {key: questions[key]}})
        want = together["answers"][key]["probabilities"]
        assert alone.json()["answers"][key]["probabilities"] == pytest.approx(want, abs=1e-6)
    assert lanes_free_within(qwen35_server)


def test_wide_choices_and_scores_use_letters_and_two_token_codes(pytestconfig, tiny_qwen3_5):
    options = {f"opt{i}": None for i in range(255)}  # 2.5k tokens of options: a server with a longer context
    levels = [f"level {i}" for i in range(50)]
    body = {"state": "x", "questions": {"c": {"type": "choice", "criteria": options},
                                        "one": {"type": "choice", "criteria": {"only": None}},
                                        "s": {"type": "score", "criteria": levels}}}
    with serve_model(artifact_for(pytestconfig, tiny_qwen3_5), "wide", max_context=4096) as live:
        r = _post(live, "/v1/systemone", body)
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert len(answers["c"]["probabilities"]) == 255
    assert math.fsum(answers["c"]["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
    assert answers["one"]["probabilities"] == {"only": 1.0} and answers["one"]["confidence"] == 1.0
    assert math.fsum(answers["s"]["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
    assert 0 <= answers["s"]["score"] <= 49


def _q(**q):
    return {"state": "s", "questions": {"a": q}}


ERRORS = [
    ("not json", b"{nope", 400),
    ("empty body", b"", 400),
    ("unknown type", _q(type="maybe"), 422),
    ("no options", _q(type="choice", criteria={}), 422),
    ("256 options", _q(type="choice", criteria={f"k{i}": None for i in range(256)}), 422),
    ("one level", _q(type="score", criteria=["only"]), 422),
    ("51 levels", _q(type="score", criteria=[str(i) for i in range(51)]), 422),
    ("duplicate keys", b'{"state":"s","questions":{"a":{"type":"choice","criteria":{"x":1,"x":2}}}}', 422),
    ("empty state", {"state": "", "questions": {"a": {"type": "noul"}}}, 422),
    ("state and messages", {"state": "s", "messages": [{"role": "user", "content": "hi"}],
                            "questions": {"a": {"type": "noul"}}}, 422),
    ("unknown question key", _q(type="noul", colour="red"), 422),
    ("bad noul criteria", _q(type="noul", criteria={"maybe": "x"}), 422),
    ("model not a string", {"model": 3, "state": "s", "questions": {"a": {"type": "noul"}}}, 422),
    ("bad temperature", {"temperature": 0, "state": "s", "questions": {"a": {"type": "noul"}}}, 422),
    ("too many questions", {"state": "s", "questions": {f"q{i}": {"type": "noul"} for i in range(257)}}, 413),
    ("over the token budget", {"state": "word " * 70_000, "questions": {"a": {"type": "noul"}}}, 413),
]


def test_the_budget_check_never_refuses_a_context_that_fits(qwen35_server):
    """more_tokens_than (a long context counted a piece at a time) against the whole text's encode, on fresh random
    texts of several pieces with words, CJK, emoji, long runs and whitespace cut anywhere: it says "more" only when
    the whole encode has more, and it does say so for a text twice the limit."""
    frontend = qwen35_server.engine.frontend
    rng = random.Random()
    words = ["word", "ticket", "€", "数据", "🙂", "\n", "  ", "x" * 40, "3.14159", "don't", "Über"]
    for _ in range(5):
        text = "".join(rng.choice(words) + rng.choice([" ", "", "\n"]) for _ in range(rng.randint(20_000, 50_000)))
        whole = len(frontend.encode(text))
        for limit in (whole // 2, whole - 40, whole - 1, whole, whole + 1000):
            if more_tokens_than(frontend, text, limit):
                assert whole > limit, (limit, whole, len(text))
        assert more_tokens_than(frontend, text, whole // 2), (whole, len(text))


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_the_error_table_in_each_routes_shape(qwen35_server, case):
    _, body, status = case
    openai_shape = _post(qwen35_server, "/v1/decisions", body)
    typesafe_shape = _post(qwen35_server, "/v1/systemone", body)
    assert openai_shape.status_code == typesafe_shape.status_code == status, (openai_shape.text, typesafe_shape.text)
    error = openai_shape.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["message"]
    detail = typesafe_shape.json()["detail"]
    if status == 422:
        assert isinstance(detail, list) and all({"type", "loc", "msg", "input"} <= set(d) for d in detail)
    else:
        assert detail["message"] and detail["error_type"] == {400: "api_usage_error",
                                                              413: "max_tokens_exceeded"}[status]


def test_a_client_that_leaves_frees_its_decision(qwen35_server):
    engine = qwen35_server.engine
    questions = {f"q{i}": {"type": "noul", "instructions": "Is it long? " * 30} for i in range(60)}
    body = {"state": "word " * 600, "questions": questions}
    assert lanes_free_within(qwen35_server)
    before = engine.stats().tokens_prefilled
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{qwen35_server.url}/v1/decisions", json=body, timeout=0.5)
    assert lanes_free_within(qwen35_server)
    stats = engine.stats()
    assert stats.kv_free_tokens == stats.kv_capacity_tokens
    left_after = stats.tokens_prefilled - before
    whole = _post(qwen35_server, "/v1/decisions", body)
    assert whole.status_code == 200
    assert left_after < whole.json()["usage"]["input_tokens"]  # it stopped part way: cancelled, not run out


def test_without_a_key_each_route_answers_401_in_its_shape(pytestconfig, tiny_qwen3_5):
    from live_servers import serve_model_with_keys

    with serve_model_with_keys(artifact_for(pytestconfig, tiny_qwen3_5), frozenset({"sekret"})) as live:
        body = {"state": "s", "questions": {"a": {"type": "noul"}}}
        a, b = (httpx.post(f"{live.url}{p}", json=body, timeout=60) for p in ROUTES)
        assert a.status_code == b.status_code == 401
        assert a.json()["error"]["type"] == "authentication_error"
        assert b.json()["detail"]["error_type"] == "authentication_error"
        ok = httpx.post(f"{live.url}/v1/systemone", json=body, headers={"Authorization": "Bearer sekret"},
                        timeout=120)
        assert ok.status_code == 200, ok.text


def test_rerank_sorts_by_a_yes_no_readout_with_top_n_and_documents(qwen35_server):
    docs = ["Paris is the capital of France.", {"text": "Bananas are yellow."}, "The Eiffel tower is in Paris."]
    full = _post(qwen35_server, "/v1/rerank", {"query": "capital of France", "documents": docs}).json()
    scores = [r["relevance_score"] for r in full["results"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert sorted(r["index"] for r in full["results"]) == [0, 1, 2]
    assert full["results"][0]["document"]["text"] in ("Paris is the capital of France.", "Bananas are yellow.",
                                                      "The Eiffel tower is in Paris.")
    top = _post(qwen35_server, "/v1/rerank", {"query": "capital of France", "documents": docs, "top_n": 2,
                                             "return_documents": False}).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in full["results"][:2]]
    assert "document" not in top["results"][0] and top["usage"]["total_tokens"] > 0
    assert _post(qwen35_server, "/v1/rerank", {"query": "q", "documents": []}).status_code == 400


def test_score_gives_the_engines_logprobs_of_the_continuation(qwen35_server):
    engine = qwen35_server.engine
    frontend = engine.frontend
    r = _post(qwen35_server, "/v1/score", {"prompt": "The cat sat on", "continuation": " the mat"}).json()
    head, tail = frontend.encode("The cat sat on"), frontend.encode(" the mat")
    want = engine.score_sync(head + tail)[len(head) - 1:]
    assert [t["id"] for t in r["tokens"]] == tail
    assert [t["logprob"] for t in r["tokens"]] == pytest.approx(want, abs=1e-6)
    assert r["usage"] == {"prompt_tokens": len(head), "continuation_tokens": len(tail),
                          "total_tokens": len(head) + len(tail)}
    text = _post(qwen35_server, "/v1/score", {"text": "hello there world"}).json()
    assert len(text["tokens"]) == len(frontend.encode("hello there world")) - 1
    chat = _post(qwen35_server, "/v1/score", {"messages": [{"role": "user", "content": "hi"},
                                                           {"role": "assistant", "content": "hello"}]})
    assert chat.status_code == 200, chat.text
    assert _post(qwen35_server, "/v1/score", {"text": "a", "prompt": "b"}).status_code == 400
