"""rag.llm: backend registry, response cache, OpenAI-compatible HTTP backend (against a local server),
FakeLLM, and (slow) the real SmolLM2 / Gemma 3 GGUF models that ship in PyPI packages."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rag.llm import LLM, LLM_BACKENDS, CachedLLM, LLMError, LLMSettings, ResponseCache, load_llm
from rag.llm.testing import FakeLLM


# ---------------------------------------------------------------- a tiny OpenAI-compatible server


class FakeOpenAIServer:
    """Serves canned replies on 127.0.0.1; `script` is consumed one entry per request, the last entry
    repeating. Each entry: (status, json body, delay seconds)."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict, float]] = []
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, reply, delay = server.script[min(len(server.requests), len(server.script)) - 1]
                if delay:
                    time.sleep(delay)
                payload = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def completion(text: str) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}


def chat_reply(text: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


@pytest.fixture
def server():
    srv = FakeOpenAIServer()
    yield srv
    srv.close()


def openai_settings(srv: FakeOpenAIServer, tmp_path: Path, **kw) -> LLMSettings:
    base = dict(
        backend="openai",
        model="tiny",
        base_url=srv.url,
        cache_dir=str(tmp_path / "cache"),
        retry_backoff_s=0.01,
        timeout_s=5.0,
    )
    return LLMSettings(**(base | kw))


# ---------------------------------------------------------------- registry and settings


def test_none_backend_gives_none(tmp_path):
    assert load_llm(LLMSettings(cache_dir=str(tmp_path))) is None
    assert load_llm(LLMSettings(backend="none", cache_dir=str(tmp_path))) is None


def test_unknown_backend_lists_known_backends(tmp_path):
    with pytest.raises(ValueError) as err:
        load_llm(LLMSettings(backend="gpt5-magic", cache_dir=str(tmp_path)))
    for known in ("openai", "local-gguf", "none"):
        assert known in str(err.value)
    assert set(LLM_BACKENDS) >= {"openai", "local-gguf", "none"}


def test_settings_defaults_and_typos(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
    s = LLMSettings()
    assert s.backend == "none" and s.temperature == 0.0 and s.api_key_env == "OPENAI_API_KEY"
    assert Path(s.cache_dir) == (tmp_path / "d" / "llm_cache").resolve()
    assert s.base_url == "http://localhost:11434/v1"
    with pytest.raises(ValueError):
        LLMSettings(temprature=0.5)


def test_local_gguf_rejects_unknown_model_names(tmp_path):
    with pytest.raises(ValueError, match="smollm2"):
        load_llm(LLMSettings(backend="local-gguf", model="gpt-4", cache_dir=str(tmp_path)))
    with pytest.raises(LLMError, match="not found"):
        load_llm(LLMSettings(backend="local-gguf", model=str(tmp_path / "missing.gguf"), cache_dir=str(tmp_path)))


def test_local_gguf_unloadable_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    llm = load_llm(LLMSettings(backend="local-gguf", model=str(bad), cache_dir=str(tmp_path)))
    with pytest.raises(LLMError, match="broken.gguf"):
        llm.complete("hello")


# ---------------------------------------------------------------- response cache


def cached_fake(tmp_path: Path, script=None, **params) -> tuple[CachedLLM, FakeLLM]:
    fake = FakeLLM(script if script is not None else (lambda x: f"reply to {x}"))
    cache = ResponseCache(tmp_path / "responses.sqlite")
    return CachedLLM(fake, cache, default_max_new_tokens=64, params=params or {"temperature": 0.0}), fake


def test_second_identical_call_is_a_cache_hit(tmp_path):
    llm, fake = cached_fake(tmp_path)
    assert isinstance(llm, LLM)
    first = llm.complete("Q: why?\nA:", stop=["\n"])
    assert llm.complete("Q: why?\nA:", stop=["\n"]) == first
    assert (llm.cache_hits, llm.cache_misses, fake.call_count) == (1, 1, 1)
    # The default passed explicitly is the same request as no value.
    llm.complete("Q: why?\nA:", max_new_tokens=64, stop=["\n"])
    assert llm.cache_hits == 2


@pytest.mark.parametrize(
    "change",
    [
        dict(max_new_tokens=10),
        dict(stop=["."]),
        dict(prompt="Q: how?\nA:"),
    ],
)
def test_different_request_is_a_miss(tmp_path, change):
    llm, fake = cached_fake(tmp_path)
    base = dict(prompt="Q: why?\nA:", max_new_tokens=None, stop=["\n"])
    llm.complete(base.pop("prompt"), **base)
    args = dict(prompt="Q: why?\nA:", max_new_tokens=None, stop=["\n"]) | change
    llm.complete(args.pop("prompt"), **args)
    assert (llm.cache_hits, llm.cache_misses, fake.call_count) == (0, 2, 2)


def test_generation_params_and_model_are_part_of_the_key(tmp_path):
    greedy, _ = cached_fake(tmp_path, temperature=0.0)
    greedy.complete("x")
    sampled, fake = cached_fake(tmp_path, temperature=0.7)
    sampled.complete("x")
    assert sampled.cache_misses == 1 and fake.call_count == 1
    other = CachedLLM(
        FakeLLM("y", name="fake:other"),
        ResponseCache(tmp_path / "responses.sqlite"),
        default_max_new_tokens=64,
        params={"temperature": 0.0},
    )
    assert other.complete("x") == "y" and other.cache_misses == 1


def test_chat_and_complete_are_cached_separately(tmp_path):
    llm, fake = cached_fake(tmp_path, script=lambda x: "same")
    messages = [{"role": "user", "content": "x"}]
    llm.chat(messages)
    llm.chat([dict(m) for m in messages])  # equal content, different objects: still a hit
    llm.complete("x")
    assert (llm.cache_hits, llm.cache_misses) == (1, 2)


def test_cache_persists_across_instances(tmp_path):
    first, _ = cached_fake(tmp_path)
    answer = first.complete("persist me")
    second, fake = cached_fake(tmp_path, script=["never used"])
    assert second.complete("persist me") == answer
    assert fake.call_count == 0 and second.cache_hits == 1


def test_failures_are_not_cached(tmp_path):
    calls = iter([RuntimeError("boom"), "ok"])

    def flaky(_):
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    llm, _ = cached_fake(tmp_path, script=flaky)
    with pytest.raises(RuntimeError):
        llm.complete("x")
    assert llm.complete("x") == "ok"


def test_cache_is_shared_by_concurrent_writers(tmp_path):
    llm, _ = cached_fake(tmp_path)
    threads = [threading.Thread(target=lambda i=i: [llm.complete(f"p{i}-{j}") for j in range(10)]) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(llm.cache) == 40


# ---------------------------------------------------------------- FakeLLM


def test_fake_llm_scripts():
    fake = FakeLLM(["one\nmore", "two"])
    assert fake.complete("a", stop=["\n"]) == "one"
    assert fake.chat([{"role": "user", "content": "b"}]) == "two"
    assert [c["kind"] for c in fake.calls] == ["complete", "chat"]
    with pytest.raises(AssertionError, match="ran out"):
        fake.complete("c")
    assert FakeLLM(str.upper).complete("abc") == "ABC"
    assert FakeLLM("fixed").complete("anything") == "fixed"


# ---------------------------------------------------------------- OpenAI-compatible backend


def test_openai_complete_and_chat(server, tmp_path, monkeypatch):
    monkeypatch.setenv("MY_LLM_KEY", "sk-test-123")
    server.script = [(200, completion(" Paris.\nQ: next"), 0), (200, chat_reply("Hello there"), 0)]
    llm = load_llm(openai_settings(server, tmp_path, api_key_env="MY_LLM_KEY", max_new_tokens=7))
    assert llm.name == "openai:tiny"
    assert llm.complete("Q: capital of France?\nA:", stop=["\n"]) == " Paris."
    assert llm.chat([{"role": "user", "content": "hi"}]) == "Hello there"

    first, second = server.requests
    assert first["path"] == "/v1/completions" and second["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == "Bearer sk-test-123"
    assert first["body"] == {
        "model": "tiny",
        "prompt": "Q: capital of France?\nA:",
        "max_tokens": 7,
        "temperature": 0.0,
        "seed": 42,
        "stop": ["\n"],
    }
    assert second["body"]["messages"] == [{"role": "user", "content": "hi"}]
    assert "sk-test-123" not in json.dumps(llm.inner.__dict__, default=str)  # key is not kept in settings/attrs


def test_openai_without_key_sends_no_auth_header(server, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.script = [(200, completion("ok"), 0)]
    load_llm(openai_settings(server, tmp_path)).complete("x")
    assert "Authorization" not in server.requests[0]["headers"]


def test_openai_responses_are_cached_across_instances(server, tmp_path):
    server.script = [(200, completion("cached answer"), 0)]
    assert load_llm(openai_settings(server, tmp_path)).complete("x") == "cached answer"
    again = load_llm(openai_settings(server, tmp_path))
    assert again.complete("x") == "cached answer"
    assert len(server.requests) == 1 and again.cache_hits == 1


def test_openai_retries_after_one_500(server, tmp_path):
    server.script = [(500, {"error": "overloaded"}, 0), (200, completion("second try"), 0)]
    assert load_llm(openai_settings(server, tmp_path)).complete("x") == "second try"
    assert len(server.requests) == 2


def test_openai_retries_on_429(server, tmp_path):
    server.script = [(429, {"error": "slow down"}, 0), (200, chat_reply("fine"), 0)]
    assert load_llm(openai_settings(server, tmp_path)).chat([{"role": "user", "content": "x"}]) == "fine"


def test_openai_gives_up_with_clear_error(server, tmp_path):
    server.script = [(503, {"error": "down for maintenance"}, 0)]
    llm = load_llm(openai_settings(server, tmp_path, retries=2))
    with pytest.raises(LLMError) as err:
        llm.complete("x")
    msg = str(err.value)
    assert f"{server.url}/completions" in msg and "503" in msg and "3 attempt" in msg
    assert len(server.requests) == 3
    assert llm.cache_misses == 1 and len(llm.cache) == 0


def test_openai_client_error_is_not_retried(server, tmp_path):
    server.script = [(404, {"error": "model 'tiny' not found"}, 0)]
    with pytest.raises(LLMError, match="404.*not found"):
        load_llm(openai_settings(server, tmp_path)).complete("x")
    assert len(server.requests) == 1


def test_openai_timeout_is_a_clear_error(server, tmp_path):
    server.script = [(200, completion("too late"), 1.0)]
    llm = load_llm(openai_settings(server, tmp_path, timeout_s=0.2, retries=1))
    # The answer comes after 1 s: without the 0.2 s timeout each attempt would get it, and nothing would raise.
    with pytest.raises(LLMError, match="timed out") as err:
        llm.complete("x")
    assert server.url in str(err.value)
    assert len(server.requests) == 2


def test_openai_connection_refused_is_a_clear_error(tmp_path):
    with socket.socket() as sock:  # a port that nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = LLMSettings(
        backend="openai",
        model="tiny",
        base_url=f"http://127.0.0.1:{port}/v1",
        cache_dir=str(tmp_path),
        retries=1,
        retry_backoff_s=0.01,
    )
    with pytest.raises(LLMError, match=f"127.0.0.1:{port}/v1/chat/completions.*connection failed"):
        load_llm(settings).chat([{"role": "user", "content": "x"}])


def test_openai_bad_json_shape_is_a_clear_error(server, tmp_path):
    server.script = [(200, {"unexpected": True}, 0)]
    with pytest.raises(LLMError, match="unexpected response shape"):
        load_llm(openai_settings(server, tmp_path)).complete("x")


# ---------------------------------------------------------------- real local models (slow)


FEW_SHOT = (
    "Question: What is the capital of France?\nAnswer: Paris\n\n"
    "Question: What colour is the sky on a clear day?\nAnswer:"
)


@pytest.mark.slow
def test_smollm2_completion_is_deterministic(tmp_path):
    llm = load_llm(LLMSettings(backend="local-gguf", model="smollm2", cache_dir=str(tmp_path), max_new_tokens=16))
    first = llm.inner.complete(FEW_SHOT, stop=["\n"])  # bypass the cache: both calls really generate
    second = llm.inner.complete(FEW_SHOT, stop=["\n"])
    assert first.strip() and first == second and "\n" not in first
    reply = llm.chat([{"role": "user", "content": "Name one planet."}], max_new_tokens=12)
    assert reply.strip()
    assert llm.complete(FEW_SHOT, stop=["\n"]) == first  # miss: generated through the wrapper
    assert llm.complete(FEW_SHOT, stop=["\n"]) == first and llm.cache_hits == 1


@pytest.mark.slow
def test_gemma3_270m_loads_and_completes(tmp_path):
    llm = load_llm(LLMSettings(backend="local-gguf", model="gemma3-270m", cache_dir=str(tmp_path), max_new_tokens=8))
    assert llm.complete(FEW_SHOT, stop=["\n"]).strip()
    assert llm.chat([{"role": "user", "content": "Name one planet."}]).strip()
