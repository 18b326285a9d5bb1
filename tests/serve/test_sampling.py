"""Sampling fields and length limits through the live servers (tests/live_servers.py) and the official SDKs: each
field must reach the engine's sampler and visibly change or constrain what comes back.

How a constraint is seen from outside: the sampler's logprobs are those of the unmodified distribution, so with
`top_logprobs` every sampled token can be placed among the likeliest tokens of its step. The tiny random Qwen3.5
model spreads its probability thinly and evenly (its top 20 tokens are within a factor of about 1.5 of each other),
so an unconstrained draw almost never lands in a small top set, and a constraint that was ignored shows at once."""

from __future__ import annotations

import math
from dataclasses import replace

import anthropic
import live_servers
import openai
import pytest
from ninfer.engine import SamplingParams
from ninfer.frontend.reasoning import split_reasoning
from ninfer.frontend.sampling_defaults import recommended_sampling

HELLO = [{"role": "user", "content": "Hello, who are you?"}]
N = 12  # tokens per sampled request
THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def _openai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _sampled(client: openai.OpenAI, top_logprobs: int = 20, extra: dict | None = None, **sampling) -> list:
    """A chat answer's logprob entries (one per generated token), thinking off so all of it is content; `extra`:
    body fields the SDK has no argument for (top_k, min_p)."""
    r = client.chat.completions.create(model="m", messages=HELLO, max_tokens=N, logprobs=True,
                                       top_logprobs=top_logprobs, extra_body={**THINKING_OFF, **(extra or {})},
                                       **sampling)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == N
    return entries


def _rank(entry) -> int | None:
    """The sampled token's place among its step's likeliest tokens (None: not among those listed)."""
    tokens = [t.token for t in entry.top_logprobs]
    return tokens.index(entry.token) if entry.token in tokens else None


def test_top_k_one_at_temperature_one_is_greedy(qwen35_server):
    """On every route that takes top_k: a one-token shortlist leaves the draw no choice."""
    client = _openai(qwen35_server)
    claude = anthropic.Anthropic(base_url=qwen35_server.url, api_key="unused", max_retries=0)
    greedy, chat, response, message = live_servers.concurrently(
        lambda: client.chat.completions.create(model="m", messages=HELLO, max_tokens=N, temperature=0),
        lambda: client.chat.completions.create(model="m", messages=HELLO, max_tokens=N, temperature=1.0,
                                               extra_body={"top_k": 1}),
        lambda: client.responses.create(model="m", input=HELLO, max_output_tokens=N, temperature=1.0,
                                        extra_body={"top_k": 1}),
        lambda: claude.messages.create(model="m", max_tokens=N, messages=HELLO,
                                       extra_body={"temperature": 1.0, "top_k": 1}),
    )
    reasoning = greedy.choices[0].message.model_extra["reasoning_content"]
    _, direct = live_servers.greedy_answer(qwen35_server, HELLO, N)
    assert reasoning == split_reasoning(direct, starts_in_reasoning=True).reasoning
    assert chat.choices[0].message.model_extra["reasoning_content"] == reasoning
    assert response.output[0].content[0].text == reasoning
    assert message.content[0].thinking == reasoning


def test_top_k_and_min_p_keep_every_sampled_token_among_the_likeliest(qwen35_server):
    client = _openai(qwen35_server)
    free, top_k, min_p = live_servers.concurrently(
        lambda: _sampled(client, temperature=1.0, seed=5, top_p=1.0, extra={"top_k": 0}),
        lambda: _sampled(client, top_logprobs=5, temperature=1.0, seed=5, extra={"top_k": 5}),
        lambda: _sampled(client, temperature=1.0, seed=5, extra={"min_p": 0.9}),
    )
    assert any(_rank(e) is None for e in free), "unconstrained draws should leave the top 20: the test means nothing"
    assert all(_rank(e) is not None for e in top_k)
    # min_p keeps the tokens whose probability is at least min_p times the likeliest one's
    assert all(e.logprob >= e.top_logprobs[0].logprob + math.log(0.9) - 1e-4 for e in min_p)
    assert any(e.logprob < e.top_logprobs[0].logprob + math.log(0.9) for e in free)


def test_a_top_p_below_every_top_token_s_probability_at_temperature_one_is_greedy(qwen35_server):
    """top_p keeps the likeliest tokens until their probabilities reach it: below 1 / vocabulary size (less than any
    step's top probability) that is the top token alone, so a draw at temperature 1 is the greedy answer. The same
    seeded draw with top_p 1 leaves the greedy path, so the comparison can fail (top_k 0 in both: no shortlist)."""
    client = _openai(qwen35_server)
    top_p = 0.5 / qwen35_server.engine.info.vocab_size
    greedy, nucleus, free = live_servers.concurrently(
        lambda: _sampled(client, temperature=0),
        lambda: _sampled(client, temperature=1.0, seed=3, top_p=top_p, extra={"top_k": 0}),
        lambda: _sampled(client, temperature=1.0, seed=3, top_p=1.0, extra={"top_k": 0}),
    )
    assert all(_rank(e) == 0 for e in nucleus)
    assert [e.token for e in nucleus] == [e.token for e in greedy]
    assert [e.token for e in free] != [e.token for e in greedy]


def test_the_artifact_s_sampling_defaults_apply_when_the_request_omits_them(qwen35_server):
    """The recommended defaults (ninfer.frontend.sampling_defaults: for Qwen3.5 with thinking off, the model card's
    non-thinking values, top_k 20 and top_p 0.8) are what a request without sampling fields gets: it equals the same
    seed with those values spelled out, differs from the plain sampler (no top_k, no top_p), and every token is among
    the 20 likeliest; a request's own values win."""
    engine = qwen35_server.engine
    defaults = recommended_sampling(engine.info.arch, engine.frontend.generation_defaults, {}, thinking=False)
    assert defaults.top_k == 20 and defaults.top_p < 1.0  # what the test relies on
    spelled_out = {"temperature": defaults.temperature, "top_p": defaults.top_p}
    extra_defaults = {"top_k": defaults.top_k, "min_p": defaults.min_p}
    plain = SamplingParams()  # the sampler's own neutral values
    client = _openai(qwen35_server)
    omitted, again, explicit, neutral = live_servers.concurrently(
        lambda: _sampled(client, seed=11),
        lambda: _sampled(client, seed=11),
        lambda: _sampled(client, seed=11, **spelled_out, extra=extra_defaults),
        lambda: _sampled(client, seed=11, temperature=plain.temperature, top_p=plain.top_p,
                         extra={"top_k": plain.top_k, "min_p": plain.min_p}),
    )
    tokens = [e.token for e in omitted]
    assert tokens == [e.token for e in again]  # seeded runs are equal
    assert tokens == [e.token for e in explicit]
    assert all(_rank(e) is not None for e in omitted)  # top_k 20 applied
    assert any(_rank(e) is None for e in neutral) and tokens != [e.token for e in neutral]


def _direct(server, prompt: str, **sampling) -> list[int]:
    """The engine's own answer, without the server, under greedy decoding and the given sampling values."""
    engine = server.engine
    params = replace(SamplingParams(temperature=0.0), **sampling)
    return live_servers.engine_tokens(engine, engine.frontend.encode(prompt), N, params)


@pytest.mark.parametrize(("field", "value", "canonical"), [
    ("frequency_penalty", -2.0, "frequency_penalty"),
    ("presence_penalty", -2.0, "presence_penalty"),
    ("repetition_penalty", 0.1, "repetition_penalty"),
    ("repeat_penalty", 0.1, "repetition_penalty"),  # llama.cpp's name
])
def test_penalties_reach_the_sampler(qwen35_server, field, value, canonical):
    """Greedy decoding of the random model writes a new token at every step; a negative penalty (or a repetition
    penalty below 1, which also counts the prompt) favours tokens already seen, so few new ones come. The server's
    answer is the engine's under the same penalty, token for token."""
    prompt = "Hello, who are you?"
    prompt_ids = qwen35_server.engine.frontend.encode(prompt)
    greedy = _direct(qwen35_server, prompt)
    penalised = _direct(qwen35_server, prompt, **{canonical: value})
    assert _new_tokens(prompt_ids, greedy) == N, "greedy repeats itself: the test would not show the penalty"
    assert _new_tokens(prompt_ids, penalised) <= N // 2
    r = _openai(qwen35_server).completions.create(model="m", prompt=prompt, max_tokens=N, temperature=0,
                                                  extra_body={field: value})
    assert r.choices[0].text == qwen35_server.engine.frontend.decode(penalised)


def _new_tokens(prompt: list[int], generated: list[int]) -> int:
    """How many generated tokens were in neither the prompt nor the output before them."""
    seen, new = set(prompt), 0
    for token in generated:
        new += token not in seen
        seen.add(token)
    return new


def test_positive_penalties_stop_a_real_model_repeating_itself(smollm2_server):
    """SmolLM2 answers "one one one ..." greedily with a short loop; a frequency penalty breaks the loop, and a
    repetition penalty (which also counts the prompt) leaves no token written twice or taken from the prompt."""
    client = _openai(smollm2_server)
    prompt = "one one one one one one one one"
    frontend = smollm2_server.engine.frontend

    def tokens(**penalty) -> list[str]:
        r = client.completions.create(model="m", prompt=prompt, max_tokens=16, temperature=0, logprobs=0,
                                      extra_body=penalty)
        assert r.usage.completion_tokens == 16
        return r.choices[0].logprobs.tokens

    greedy, frequency, repetition = live_servers.concurrently(
        lambda: tokens(), lambda: tokens(frequency_penalty=2.0), lambda: tokens(repetition_penalty=3.0))
    assert len(set(greedy)) <= len(greedy) // 2, "SmolLM2 no longer loops here: the test would not mean anything"
    assert len(set(frequency)) >= len(frequency) - 2
    prompt_tokens = {frontend.decode([t], skip_special_tokens=False) for t in frontend.encode(prompt)}
    assert len(set(repetition)) == len(repetition) and not set(repetition) & prompt_tokens


def test_max_completion_tokens_and_max_output_tokens_limit_generation(qwen35_server):
    client = _openai(qwen35_server)
    both, alone, response = live_servers.concurrently(
        lambda: client.chat.completions.create(model="m", messages=HELLO, temperature=0, max_tokens=9,
                                               max_completion_tokens=5),
        lambda: client.chat.completions.create(model="m", messages=HELLO, temperature=0, max_completion_tokens=7),
        lambda: client.responses.create(model="m", input=HELLO, temperature=0, max_output_tokens=6),
    )
    assert both.usage.completion_tokens == 5 and both.choices[0].finish_reason == "length"  # the newer name wins
    assert alone.usage.completion_tokens == 7 and alone.choices[0].finish_reason == "length"
    assert response.usage.output_tokens == 6 and response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
