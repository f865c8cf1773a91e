"""llama.cpp runner (llama-cpp-python bindings over the venv's own llama.cpp build).

Run with the llamacpp venv's python; ``LLAMA_CPP_LIB_PATH`` names the build's bin/ (libllama.so
and llama-server). Ops beyond the protocol's: ``serve`` starts llama.cpp's own OpenAI-compatible
``llama-server`` with parallel slots (continuous batching) on a free port. ``generate_batch``
runs on such a server, one slot per prompt: every prompt is sent at once (one thread each) to
its slot's native streamed ``/completion``, each token stamped as its event arrives. Distinct
prompts go with ``cache_prompt`` off. When a prompt repeats, each distinct prompt is prefilled
once before the batch: its first slot runs it, the slot's cache is saved
(``/slots/{id}?action=save``) and restored into the other slots of the same prompt, and then
every request goes with ``cache_prompt`` on, so each slot evaluates only its prompt's last token
before it decodes.

``load`` takes the layers' ``attention_windows`` (None for a global layer; all global when
absent): on a model with sliding-window layers llama.cpp keeps its SWA cache (``swa_full``
off, as llama-server does; the bindings' own default is a full-size cache on every layer),
whose size its KV bytes follow: a global layer holds ``n_ctx`` cells, a sliding one
``GGML_PAD(min(n_ctx, window + n_ubatch), 256)`` (``llama_kv_cache_iswa``).

``load`` options: ``flash_attn`` (default off, the bindings' default; the server gets the same
setting instead of its ``auto``). On this project's CPU (2 cores, AVX-512) flash attention
measured 5-10× slower decode and 1.7× slower prefill at 4k tokens, and changed greedy tokens.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from importlib.metadata import version
from pathlib import Path

from peer_protocol import batch_reply, generation_reply, serve

F16_BYTES = 2
SLOT_MARGIN = 64  # tokens beyond prompt + new tokens in each slot
N_UBATCH = 512  # the bindings' and llama-server's default physical batch
SWA_PAD = 256  # "the SWA cache is always padded to 256"


class LlamaCppRunner:
    def __init__(self) -> None:
        self.llm = None
        self.model_path = ""
        self.n_threads = 0
        self.flash_attn = False
        self.attention_windows: list[int | None] = []
        self.servers: list[subprocess.Popen] = []

    def hello(self, args: dict) -> dict:
        import llama_cpp

        return {"system": "llama.cpp", "pid": os.getpid(),
                "versions": {"llama-cpp-python": version("llama-cpp-python")},
                "system_info": llama_cpp.llama_print_system_info().decode().strip()}

    def load(self, args: dict) -> dict:
        from llama_cpp import Llama

        self.flash_attn = args.get("options", {}).get("flash_attn", False)
        start = time.perf_counter()
        self.llm = Llama(model_path=args["model"], n_ctx=args["n_ctx"],
                         n_threads=args["n_threads"], n_threads_batch=args["n_threads"],
                         n_ubatch=N_UBATCH, flash_attn=self.flash_attn, swa_full=False,
                         verbose=False)
        self.model_path, self.n_threads = args["model"], args["n_threads"]
        layers = int(self._meta("block_count"))
        self.attention_windows = args.get("attention_windows") or [None] * layers
        if len(self.attention_windows) != layers:
            raise ValueError(f"attention_windows: {len(self.attention_windows)} entries for "
                             f"{layers} layers")
        return {"load_s": time.perf_counter() - start,
                "settings": {"n_ctx": self.llm.n_ctx(), "n_batch": self.llm.n_batch,
                             "n_ubatch": N_UBATCH, "flash_attn": self.flash_attn,
                             "swa_full": False}}

    def generate(self, args: dict) -> dict:
        if self.llm is None:
            raise RuntimeError("generate before load")
        prompt_ids, max_new = args["prompt_ids"], args["max_new_tokens"]
        self.llm.reset()  # no prefix reuse between requests: every prompt is prefilled whole
        token_ids, stamps = [], []
        start = time.perf_counter()
        for token in self.llm.generate(prompt_ids, temp=0.0, top_k=1, repeat_penalty=1.0):
            stamps.append(time.perf_counter())
            token_ids.append(int(token))
            if len(token_ids) == max_new:
                break
        n_ctx = self.llm.n_ctx()
        return generation_reply(
            start=start, stamps=stamps, token_ids=token_ids, kv_bytes=self._kv_bytes(n_ctx),
            kv_note=f"f16 K and V reserved for n_ctx={n_ctx}: {self._kv_rule()}, from the "
                    "model shape",
            extra={"kv_bytes_used": self._kv_bytes(len(prompt_ids + token_ids))})

    def _meta(self, key: str) -> str | None:
        meta = self.llm.metadata
        return meta.get(f"{meta['general.architecture']}.{key}")

    def _kv_bytes(self, n_ctx: int) -> int:
        """K and V of every layer's cells for a context of ``n_ctx`` tokens (sliding layers:
        llama.cpp's SWA cache)."""
        cells = sum(n_ctx if window is None else
                    -(-min(n_ctx, window + N_UBATCH) // SWA_PAD) * SWA_PAD
                    for window in self.attention_windows)
        kv_heads = int(self._meta("attention.head_count_kv"))
        head_dim = int(self._meta("attention.key_length") or int(self._meta("embedding_length"))
                       // int(self._meta("attention.head_count")))
        return 2 * cells * kv_heads * head_dim * F16_BYTES

    def _kv_rule(self) -> str:
        sliding = [w for w in self.attention_windows if w is not None]
        rule = "2 × layers × n_ctx × kv_heads × head_dim × 2 bytes"
        if not sliding:
            return rule
        return (f"{rule}, the {len(sliding)} sliding-window layers (window {max(sliding)}) "
                f"holding pad256(min(n_ctx, window + {N_UBATCH})) cells instead of n_ctx")

    def serve(self, args: dict) -> dict:
        """Start ``llama-server`` with ``n_parallel`` slots of ``n_ctx_per_slot`` tokens each;
        returns its base URL once /health answers. It dies with this runner."""
        binary = Path(os.environ["LLAMA_CPP_LIB_PATH"]) / "llama-server"
        port = args.get("port") or _free_port()
        n_parallel = args["n_parallel"]
        argv = [str(binary), "--model", args.get("model", self.model_path), "--host", "127.0.0.1",
                "--port", str(port), "--ctx-size", str(args["n_ctx_per_slot"] * n_parallel),
                "--parallel", str(n_parallel), "--cont-batching",
                "--flash-attn", "on" if self.flash_attn else "off",
                "--threads", str(args.get("n_threads", self.n_threads)),
                "--threads-batch", str(args.get("n_threads", self.n_threads)),
                *args.get("extra_args", [])]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr,
                                stderr=sys.stderr, preexec_fn=_die_with_parent)
        self.servers.append(proc)
        base_url = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, base_url, timeout_s=args.get("timeout_s", 120))
        return {"base_url": base_url, "openai_base_url": f"{base_url}/v1", "pid": proc.pid,
                "argv": argv}

    def generate_batch(self, args: dict) -> dict:
        if self.llm is None:
            raise RuntimeError("generate_batch before load")
        prompts, max_new = args["prompts"], args["max_new_tokens"]
        per_slot = max(map(len, prompts)) + max_new + SLOT_MARGIN
        repeated = len({tuple(ids) for ids in prompts}) < len(prompts)
        self.stop_servers()  # one server at a time: each holds its whole KV cache
        with tempfile.TemporaryDirectory(prefix="llama-slots-") as slot_dir:
            server = self.serve({"n_parallel": len(prompts), "n_ctx_per_slot": per_slot,
                                 "extra_args": ["--slot-save-path", slot_dir]})
            start = time.perf_counter()
            if repeated:
                _share_prefills(server["base_url"], prompts)
            primed_s = time.perf_counter() - start
            streams = [_Completion(server["base_url"], ids, max_new, slot, repeated)
                       for slot, ids in enumerate(prompts)]
            for stream in streams:
                stream.start()
            for stream in streams:
                stream.join()
        failed = [s.error for s in streams if s.error]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(streams)} requests failed: {failed[0]}")
        return batch_reply(
            start=start, stamps=[s.stamps for s in streams],
            token_ids=[s.token_ids for s in streams], kv_bytes=self._kv_bytes(per_slot),
            kv_note=f"f16 K and V of one slot, n_ctx = {per_slot} tokens (prompt + new tokens "
                    f"+ {SLOT_MARGIN}): {self._kv_rule()}",
            extra={"argv": server["argv"], "shared_prefill_s": primed_s if repeated else None,
                   "prompt_tokens_evaluated": [s.prompt_evaluated for s in streams]},
            server_pid=server["pid"])

    def stop_servers(self) -> None:
        for proc in self.servers:
            proc.terminate()
        for proc in self.servers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.servers.clear()


class _Completion(threading.Thread):
    """One greedy streamed request to llama-server's native ``/completion``."""

    def __init__(self, base_url: str, prompt_ids: list[int], max_new_tokens: int, slot: int,
                 cache_prompt: bool) -> None:
        super().__init__(daemon=True)
        self.body = json.dumps({
            "prompt": prompt_ids, "n_predict": max_new_tokens, "stream": True,
            "id_slot": slot, "cache_prompt": cache_prompt, "temperature": 0.0,
            "ignore_eos": True, "return_tokens": True}).encode()
        self.url = f"{base_url}/completion"
        self.stamps: list[float] = []
        self.token_ids: list[int] = []
        self.prompt_evaluated: int | None = None  # the server's count, in its last event
        self.error: str | None = None

    def run(self) -> None:
        request = urllib.request.Request(self.url, data=self.body,
                                         headers={"Content-Type": "application/json"})
        try:  # no read timeout: a slot's first event waits for the prompts before it (8 x 16k
            # on 2 cores: over an hour); the caller's timeout bounds the whole batch
            with urllib.request.urlopen(request) as response:
                for line in response:
                    if not line.startswith(b"data: "):
                        continue
                    now = time.perf_counter()
                    event = json.loads(line[len(b"data: "):])
                    tokens = event.get("tokens") or []
                    self.token_ids += tokens
                    self.stamps += [now] * len(tokens)
                    if "timings" in event:
                        self.prompt_evaluated = event["timings"].get("prompt_n")
        except (OSError, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"


def _share_prefills(base_url: str, prompts: list[list[int]]) -> None:
    """Prefills each distinct prompt once, in the first slot that gets it, and restores that
    slot's cache into the other slots of the same prompt."""
    first_slot: dict[tuple[int, ...], int] = {}
    for slot, ids in enumerate(prompts):
        key = tuple(ids)
        filename = f"prompt-{first_slot.setdefault(key, slot)}.bin"
        if first_slot[key] == slot:
            _post(f"{base_url}/completion", {"prompt": ids, "n_predict": 1, "id_slot": slot,
                                             "cache_prompt": True, "temperature": 0.0})
            _post(f"{base_url}/slots/{slot}?action=save", {"filename": filename})
        else:
            _post(f"{base_url}/slots/{slot}?action=restore", {"filename": filename})


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:  # a long prefill: no read timeout
        return json.load(response)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_healthy(proc: subprocess.Popen, base_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError(f"llama-server at {base_url} not healthy after {timeout_s} s")


def main() -> None:
    runner = LlamaCppRunner()
    try:
        serve({"hello": runner.hello, "load": runner.load, "generate": runner.generate,
               "serve": runner.serve, "generate_batch": runner.generate_batch})
    finally:
        runner.stop_servers()


if __name__ == "__main__":
    main()
