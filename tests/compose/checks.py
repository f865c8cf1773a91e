"""What both compose clusters are asked: a correct answer from the default model through both
public APIs, streamed and not; a stream that outlives the decode container serving it."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import openai

from snapstream.client import SnapstreamClient
from tests.compose.cluster import containers, metrics

QUESTION = [{"role": "user", "content": "Name three primary colors."}]
# a prompt the default model continues for hundreds of tokens (greedy), so a stream is long
# enough to lose its decode container midway
COUNTING = "Count from 1 to 500: 1, 2, 3, 4, 5,"
# long enough that the stream is still running once its container is found and stopped, short
# enough that a stopped container drains it within its stop timeout
STREAM_TOKENS = 320


def check_openai_answers(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    assert model.startswith("SmolLM2-135M-Instruct")
    answer = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24,
                                            temperature=0)
    text = answer.choices[0].message.content
    assert all(color in text for color in ("Red", "Blue", "Yellow")), text
    assert answer.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24,
                                              temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed
                   if chunk.choices) == text


def check_sdk_answers(client: SnapstreamClient) -> None:
    info = client.info()
    assert info.model_name.startswith("SmolLM2-135M-Instruct") and info.has_chat_template
    completion = client.chat(QUESTION, max_new_tokens=24, temperature=0.0)
    assert all(color in completion.text for color in ("Red", "Blue", "Yellow")), completion.text
    assert completion.finish_reason == "stop_token"
    with client.chat_stream(QUESTION, max_new_tokens=24, temperature=0.0) as stream:
        chunks = list(stream)
    assert tuple(t for chunk in chunks for t in chunk.token_ids) == completion.token_ids
    assert "".join(chunk.text for chunk in chunks) == completion.text


def serving_decode(candidates: list[str], gets_before: list[float]) -> str:
    """The decode container that fetched a blob since ``gets_before`` (the only stream started
    since): a counter, so it names the container even if the stream has ended meanwhile."""
    (busy,) = [c for c, before in zip(candidates, gets_before, strict=True)
               if blob_gets(metrics(c, 9103)) > before]
    return busy


def check_stream_outlives_its_decode(client: SnapstreamClient,
                                     stop: Callable[[str], None]) -> str:
    """``stop``s the decode container serving a stream after its first tokens: the client still
    gets every token, identical to an uninterrupted run. Returns the stopped container."""
    reference = client.generate(COUNTING, max_new_tokens=STREAM_TOKENS, temperature=0.0)
    assert reference.completion_tokens == STREAM_TOKENS, reference.finish_reason
    decode = containers("decode")
    gets_before = [blob_gets(metrics(c, 9103)) for c in decode]
    received: list[int] = []
    with client.generate_stream(COUNTING, max_new_tokens=STREAM_TOKENS,
                                temperature=0.0) as stream:
        for chunk in stream:
            received.extend(chunk.token_ids)
            if len(received) >= 16:
                break
        victim = serving_decode(decode, gets_before)
        stopper = threading.Thread(target=stop, args=(victim,))
        stopper.start()
        received.extend(t for chunk in stream for t in chunk.token_ids)
        result = stream.result()
        stopper.join()
    assert tuple(received) == reference.token_ids
    assert result.completion_tokens == STREAM_TOKENS
    return victim


def failovers(router_metrics: str) -> float:
    match = re.search(r"^snapstream_decode_failovers_total (\S+)$", router_metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def blob_gets(decode_metrics: str) -> float:
    match = re.search(r'snapstream_blob_transfer_seconds_count\{op="get"\} (\S+)', decode_metrics)
    return float(match.group(1)) if match else 0.0
