"""`snapstream chat` and `snapstream generate --chat` in process, on a tiny model."""

from __future__ import annotations

import io
import json

from cli.main import main
from snapstream.chat import ChatMessage
from snapstream.engine import Engine
from snapstream.policy import CachePolicy
from snapstream.sampling_params import SamplingParams


def test_generate_chat_sends_the_prompt_as_a_user_turn(tiny_model_dir, capsys):
    args = ["generate", "--model", str(tiny_model_dir), "--chat", "--prompt", "hello there",
            "--max-new-tokens", "6", "--policy", "full", "--json"]
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)
    engine = Engine.from_pretrained(tiny_model_dir)
    prompt = engine.tokenizer.render_chat([ChatMessage("user", "hello there")])
    expected = engine.generate(prompt, 6, policy=CachePolicy(kind="full"),
                               sampling=SamplingParams(temperature=0.0))
    assert got["token_ids"] == expected.token_ids


def test_generate_chat_needs_a_text_prompt(tiny_model_dir, capsys):
    assert main(["generate", "--model", str(tiny_model_dir), "--chat", "--prompt-ids", "1,2"]) == 2
    assert "--chat needs --prompt" in capsys.readouterr().err


def test_chat_answers_each_turn_and_keeps_the_history(tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("first question\n\nsecond one\n"))
    args = ["chat", "--model", str(tiny_model_dir), "--max-new-tokens", "5", "--policy", "full"]
    assert main(args) == 0  # EOF at the prompt ends the chat
    out = capsys.readouterr().out
    engine = Engine.from_pretrained(tiny_model_dir)
    greedy = SamplingParams(temperature=0.0)
    history = [ChatMessage("user", "first question")]
    first = engine.generate(engine.tokenizer.render_chat(history), 5,
                            policy=CachePolicy(kind="full"), sampling=greedy).text
    history += [ChatMessage("assistant", first), ChatMessage("user", "second one")]
    second = engine.generate(engine.tokenizer.render_chat(history), 5,
                             policy=CachePolicy(kind="full"), sampling=greedy).text
    assert out.count("you> ") == 4 and f"you> {first}\n" in out and f"{second}\n" in out


def test_chat_refuses_a_model_without_a_template(tmp_path, capsys):
    from tests.tiny_models import random_model, tiny_config, write_hf_dir

    path = write_hf_dir(tmp_path / "plain", random_model(tiny_config()), chat_template=None)
    assert main(["chat", "--model", str(path)]) == 2
    assert "has no chat template" in capsys.readouterr().err



def test_chat_loads_the_dtype_it_is_given(tiny_model_dir, capsys, monkeypatch):
    """In process, --dtype picks the engine's weight format; a router's is not the chat's."""
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    loaded = []
    real = Engine.from_pretrained
    monkeypatch.setattr(Engine, "from_pretrained",
                        lambda *a, **kw: loaded.append(kw["dtype"]) or real(*a, **kw))
    assert main(["chat", "--model", str(tiny_model_dir), "--dtype", "int8",
                 "--max-new-tokens", "2"]) == 0
    assert loaded == ["int8"]
    assert main(["chat", "--addr", "127.0.0.1:1", "--dtype", "float32"]) == 2
    assert "--dtype is the in-process engine's" in capsys.readouterr().err
