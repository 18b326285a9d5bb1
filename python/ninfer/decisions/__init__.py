"""Decision scoring (TypeSafe's System One contract): parse a request, render each question's prompt, read the
answer over the candidate tokens, compute the confidences. No engine and no HTTP here: ninfer.serve.decisions runs
these over an engine (`Engine.decide`) and answers them on `/v1/decisions` and `/v1/systemone`."""
