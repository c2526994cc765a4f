"""Prefix affinity against least connections, through a real endpoint: a multi-turn chat workload run
once per routing mode, in one run, each mode's figures against the first mode's (the baseline).

    python3 benchmarks/affinity.py --url http://10.77.0.12:9000 --model tiny-gguf \\
        --metrics http://10.77.0.12:8000/metrics --metrics http://10.77.0.13:8000/metrics \\
        --inventory INVENTORY.yaml --endpoint lab-tiny \\
        --switch-command 'invoke provision --host cpu-2 --inventory {inventory}'

The workload: --conversations conversations of --turns turns each. Every conversation opens with the
same system prompt (--system-words) and its own first question; each turn adds the model's answer
(streamed, --max-tokens) and a new question (--turn-words), and resends the whole history, as a chat
client does. --clients clients send at once, each taking the next turn of the conversation that has
waited longest, so the conversations' turns interleave as many users' do. Each mode gets conversations
of its own (no mode finds another's history cached); before the first, each replica is sent the
system prompt once, directly, so that every mode starts with it cached everywhere.

Switching the mode: before each mode the --switch-command runs (an argv, split as a shell would but
run without one), with {routing} replaced by the mode and {inventory} by a copy of --inventory whose
--endpoint has that routing (written beside it, removed at the end: the tool's endpoint settings live
in the inventory, not in --set; an inventory kept as a directory needs a command of its own). Then
the endpoint must answer GET /v1/models again. Without
--switch-command it measures the endpoint as it is, once, under the first --modes name: run it again
after changing the routing, and compare by hand.

Per mode: requests, failures (an HTTP error, or an error inside a stream), the prompt tokens the
replicas saw and those they took from their prefix cache (their own counters, read from each --metrics
page before and after the mode: llama.cpp's llamacpp:prompt_tokens_total and
llamacpp:prompt_tokens_cached_total, or vLLM's prefix cache counters with --engine vllm), the cached
share, and the time to the first token through the endpoint (p50, p95). Defaults fit a model serving a
256-token context per slot: a 60-word system prompt, 15-word questions and 8-token answers over 4
turns stay under about 220 tokens (a word is a token with the lab's word-level tokenizers, about 1.3
with a BPE one). The API key is read from the environment (--api-key-env, default VLLM_API_KEY), never
from the command line.
"""
from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import random
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provision import engines, parsers  # the engines' metric names and the tool's own parser

MODES = ("least-connections", "prefix-affinity")
WORDS = ("river", "stone", "garden", "window", "signal", "copper", "lantern", "harbor", "meadow", "engine",
         "silver", "canyon", "market", "planet", "ladder", "orchard", "pencil", "thunder", "velvet", "harvest",
         "island", "mirror", "rocket", "saddle", "timber", "violet", "walnut", "yellow", "zephyr", "anchor")


# -- the workload (pure) ------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    conversations: int = 16
    turns: int = 4
    clients: int = 4
    system_words: int = 60
    turn_words: int = 15
    max_tokens: int = 8
    # "chat": /v1/chat/completions, the history as messages; "completions": /v1/completions, the history
    # as one growing text (Q:/A: lines), for a model whose chat template fills a small context (the
    # lab's tiny GGUF: 256 tokens, about one token a character).
    api: str = "chat"


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def system_prompt(workload: Workload) -> str:
    """The system prompt every conversation shares (the same in every mode)."""
    return "You answer briefly. " + words(random.Random(7), max(0, workload.system_words - 3))


def question(workload: Workload, mode: str, conversation: int, turn: int) -> str:
    """Turn `turn`'s question of one conversation: its own words, in this mode only."""
    rng = random.Random(f"{mode}/{conversation}/{turn}")
    opening = f"#{mode[:2]}{conversation}.{turn}"  # its own in each mode: no mode reads another's cache
    return f"{opening} {words(rng, max(1, workload.turn_words - len(opening.split())))}"


def messages(workload: Workload, mode: str, conversation: int, answers: Sequence[str]) -> list[dict[str, str]]:
    """The request of the turn after `answers` (the model's answers so far): the whole history."""
    said = [{"role": "system", "content": system_prompt(workload)}]
    for turn, answer in enumerate(answers):
        said += [{"role": "user", "content": question(workload, mode, conversation, turn)},
                 {"role": "assistant", "content": answer}]
    return said + [{"role": "user", "content": question(workload, mode, conversation, len(answers))}]


def prompt(workload: Workload, mode: str, conversation: int, answers: Sequence[str]) -> str:
    """The completions API's request of the turn after `answers`: the same history as one text."""
    said = [system_prompt(workload)]
    for turn, answer in enumerate(answers):
        said.append(f"Q: {question(workload, mode, conversation, turn)}\nA:{answer}")
    return "\n".join([*said, f"Q: {question(workload, mode, conversation, len(answers))}\nA:"])


def request_of(workload: Workload, mode: str, conversation: int, answers: Sequence[str]) -> Said:
    """The turn's request in the workload's API: its history as messages or as one text."""
    if workload.api == "completions":
        return prompt(workload, mode, conversation, answers)
    return messages(workload, mode, conversation, answers)


Said = list[dict[str, str]] | str


def words_at_last_turn(workload: Workload) -> int:
    """The words of the longest request (the last turn's), the answers counted at max_tokens words:
    what must fit the served context with the answer."""
    return workload.system_words + workload.turns * workload.turn_words + (workload.turns - 1) * workload.max_tokens


# -- one streamed turn --------------------------------------------------------------------------

@dataclass
class Turn:
    ttft_s: float | None = None
    text: str = ""
    error: str | None = None


def read_stream(lines: Iterable[bytes], started: float, clock: Callable[[], float] = time.monotonic) -> Turn:
    """An OpenAI chat stream (server-sent events) -> the answer's text, the seconds to its first
    content, or the error a stream carried (an error inside a stream is a failed request)."""
    turn = Turn()
    done = False
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            event = json.loads(data)
        except ValueError:
            return Turn(turn.ttft_s, turn.text, f"not JSON in the stream: {data[:120]}")
        if isinstance(event, dict) and event.get("error"):
            error = event["error"]
            return Turn(turn.ttft_s, turn.text, str(error.get("message", error) if isinstance(error, dict) else error))
        for choice in event.get("choices") or []:
            content = (choice.get("delta") or {}).get("content") or choice.get("text")
            if content:
                if turn.ttft_s is None:
                    turn.ttft_s = clock() - started
                turn.text += content
    if not done:
        turn.error = "the stream ended without [DONE]"
    return turn


def ask(url: str, key: str | None, model: str, said: Said, max_tokens: int,
        timeout: float = 300) -> Turn:
    """One streamed turn: a chat (`said` the messages) or a completion (`said` the prompt)."""
    history = {"prompt": said} if isinstance(said, str) else {"messages": said}
    body = json.dumps({**history, "model": model, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True}).encode()
    path = "/v1/completions" if isinstance(said, str) else "/v1/chat/completions"
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    started = time.monotonic()
    try:
        connection.request("POST", parts.path.rstrip("/") + path, body=body, headers=headers)
        response = connection.getresponse()
        if response.status != 200:
            return Turn(error=f"HTTP {response.status}: {response.read()[:200].decode('utf-8', 'replace')}")
        return read_stream(response, started)
    except (OSError, http.client.HTTPException) as exc:
        return Turn(error=f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()


# -- the replicas' counters (pure) --------------------------------------------------------------

def cache_counts(page: str, names: engines.MetricNames) -> tuple[float, float]:
    """(prompt tokens taken from the prefix cache, prompt tokens in all) so far, from one metrics page,
    by the engine's names (llama.cpp counts cached and computed prompt tokens apart)."""
    hits, queries = parsers.prefix_counts(parsers.parse_metrics(page), names.prefix_hits, names.prefix_queries)
    if hits is None or queries is None:
        raise ValueError(f"the metrics page has none of {', '.join((*names.prefix_hits, *names.prefix_queries[0]))}")
    return hits, queries


def cache_delta(before: Mapping[str, str], after: Mapping[str, str], names: engines.MetricNames) -> tuple[float, float]:
    """(cached, prompt) tokens over a mode, summed over the replicas (pages keyed by metrics URL)."""
    cached = prompt = 0.0
    for url in after:
        hits_before, queries_before = cache_counts(before[url], names)
        hits_after, queries_after = cache_counts(after[url], names)
        cached += hits_after - hits_before
        prompt += queries_after - queries_before
    return cached, prompt


# -- the figures (pure) -------------------------------------------------------------------------

def percentile(values: Sequence[float], share: float) -> float | None:
    """The nearest-rank percentile (share 0..1); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


@dataclass
class ModeResult:
    mode: str
    requests: int = 0
    failures: int = 0
    cached_tokens: float = 0.0
    prompt_tokens: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def cached_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def figures(self) -> dict[str, Any]:
        return {"mode": self.mode, "requests": self.requests, "failures": self.failures,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "cached_share": self.cached_share, "ttft_p50_s": percentile(self.ttft_s, 0.5),
                "ttft_p95_s": percentile(self.ttft_s, 0.95), "seconds": round(self.seconds, 2),
                "errors": self.errors[:5]}


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value is not None and base else "-"


def table(results: Sequence[ModeResult]) -> str:
    """The modes' figures, each against the first mode's (the baseline, measured in the same run)."""
    base = results[0].figures() if results else {}
    lines = [(f"{'mode':<18} {'requests':>8} {'failed':>6} {'prompt tok':>10} {'cached tok':>10} {'cached':>7} "
              f"{'x base':>7} {'TTFT p50':>9} {'x base':>7} {'TTFT p95':>9} {'x base':>7}")]
    for result in results:
        row = result.figures()
        share = row["cached_share"]
        lines.append(
            f"{row['mode']:<18} {row['requests']:>8} {row['failures']:>6} {row['prompt_tokens']:>10.0f} "
            f"{row['cached_tokens']:>10.0f} {'-' if share is None else f'{share:.1%}':>7} "
            f"{_ratio(share, base['cached_share']):>7} {_ms(row['ttft_p50_s']):>9} "
            f"{_ratio(row['ttft_p50_s'], base['ttft_p50_s']):>7} {_ms(row['ttft_p95_s']):>9} "
            f"{_ratio(row['ttft_p95_s'], base['ttft_p95_s']):>7}")
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


# -- switching the mode -------------------------------------------------------------------------

def inventory_with_routing(path: Path, endpoint: str, routing: str) -> Path:
    """A copy of the inventory file beside it, its endpoint's routing set (the original untouched)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    found = (data.get("endpoints") or {}).get(endpoint) if isinstance(data, dict) else None
    if not isinstance(found, dict):
        raise SystemExit(f"{path} has no endpoint {endpoint!r} under endpoints:")
    found["routing"] = routing
    copy = path.with_name(f".{path.stem}.routing-{routing}{path.suffix}")
    copy.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return copy


def switch_argv(template: str, routing: str, inventory: Path | None) -> list[str]:
    """The switch command's argv for one mode: split as a shell would, then {routing} and {inventory}
    replaced in each word (no shell runs it)."""
    values = {"routing": routing, "inventory": str(inventory) if inventory else ""}
    return [word.format(**values) for word in shlex.split(template)]


# -- running it ---------------------------------------------------------------------------------

def get(url: str, key: str | None, timeout: float = 10) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code, ""
    except OSError as exc:
        return 0, str(exc)


def wait_ready(url: str, key: str | None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while get(url.rstrip("/") + "/v1/models", key)[0] != 200:
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} does not answer GET /v1/models with 200 after {timeout:.0f} s")
        time.sleep(1)


def pages(urls: Sequence[str], key: str | None) -> dict[str, str]:
    found = {}
    for url in urls:
        status, text = get(url, key)
        if status != 200:
            raise SystemExit(f"{url}: HTTP {status or text}")
        found[url] = text
    return found


def run_mode(mode: str, args: argparse.Namespace, workload: Workload, key: str | None,
             names: engines.MetricNames) -> ModeResult:
    """One mode's workload: the conversations' turns interleaved over the clients."""
    result = ModeResult(mode)
    answers: dict[int, list[str]] = {number: [] for number in range(workload.conversations)}
    # Conversations whose next turn may go, taken in a random order (seeded: the same in every mode), as
    # people's replies come: in a fixed order, turn k of conversation c would always be request
    # c + k x conversations, and least-connections' alternation would send it to the same replica.
    waiting = list(range(workload.conversations))
    order = random.Random(11)
    lock = threading.Lock()
    wake = threading.Condition(lock)
    busy = 0

    def client() -> None:
        nonlocal busy
        while True:
            with wake:
                while not waiting and busy:
                    wake.wait()
                if not waiting:
                    return
                number = waiting.pop(order.randrange(len(waiting)))
                busy += 1
                said = request_of(workload, mode, number, answers[number])
            turn = ask(args.url, key, args.model, said, workload.max_tokens)
            with wake:
                busy -= 1
                result.requests += 1
                if turn.error:
                    result.failures += 1
                    result.errors.append(turn.error)
                elif turn.ttft_s is not None:
                    result.ttft_s.append(turn.ttft_s)
                answers[number].append(turn.text)
                if len(answers[number]) < workload.turns:
                    waiting.append(number)
                wake.notify_all()

    before = pages(args.metrics, key)
    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(workload.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.seconds = time.monotonic() - started
    time.sleep(1)  # the engines count a request's tokens as it ends
    result.cached_tokens, result.prompt_tokens = cache_delta(before, pages(args.metrics, key), names)
    return result


def warm(args: argparse.Namespace, workload: Workload, key: str | None) -> None:
    """The system prompt once to each replica directly (its API is where its metrics page is)."""
    for url in args.metrics:
        parts = urllib.parse.urlsplit(url)
        base = f"{parts.scheme}://{parts.netloc}"
        said: Said = [{"role": "system", "content": system_prompt(workload)}, {"role": "user", "content": "warm up"}]
        if workload.api == "completions":
            said = f"{system_prompt(workload)}\nQ: warm up\nA:"
        turn = ask(base, key, args.model, said, 1)
        if turn.error:
            print(f"warning: warming {base} failed: {turn.error}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--url", required=True, help="the endpoint, e.g. http://10.77.0.12:9000")
    parser.add_argument("--model", required=True, help="the served model name to ask for")
    parser.add_argument("--metrics", action="append", required=True,
                        help="a replica's metrics page (repeat for each replica)")
    parser.add_argument("--api-key-env", default="VLLM_API_KEY", help="the environment variable holding the key")
    parser.add_argument("--engine", default="llamacpp", choices=["llamacpp", "vllm"],
                        help="whose metric names the replicas' pages use")
    parser.add_argument("--modes", default=",".join(MODES), help="routing modes, in order; the first is the baseline")
    parser.add_argument("--switch-command", help="run before each mode: {routing} and {inventory} replaced")
    parser.add_argument("--inventory", type=Path, help="the inventory file whose endpoint --switch-command sets")
    parser.add_argument("--endpoint", help="the endpoint's name in --inventory")
    parser.add_argument("--conversations", type=int, default=Workload.conversations)
    parser.add_argument("--turns", type=int, default=Workload.turns)
    parser.add_argument("--clients", type=int, default=Workload.clients)
    parser.add_argument("--system-words", type=int, default=Workload.system_words)
    parser.add_argument("--turn-words", type=int, default=Workload.turn_words)
    parser.add_argument("--max-tokens", type=int, default=Workload.max_tokens)
    parser.add_argument("--api", choices=["chat", "completions"], default=Workload.api,
                        help="chat: the history as messages; completions: as one text (small contexts)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.inventory and not args.endpoint:
        parser.error("--inventory needs --endpoint")
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not args.switch_command:
        modes = modes[:1]
    workload = Workload(args.conversations, args.turns, args.clients, args.system_words, args.turn_words,
                        args.max_tokens, args.api)
    key = os.environ.get(args.api_key_env)
    names = engines.ENGINES[args.engine].metrics
    print(f"{workload.conversations} conversations x {workload.turns} turns, {workload.clients} clients; "
          f"the longest request ~{words_at_last_turn(workload)} words + {workload.max_tokens} tokens answered",
          file=sys.stderr)
    results: list[ModeResult] = []
    copies: list[Path] = []
    try:
        for mode in modes:
            if args.switch_command:
                copy = inventory_with_routing(args.inventory, args.endpoint, mode) if args.inventory else None
                copies += [copy] if copy else []
                command = switch_argv(args.switch_command, mode, copy)
                print(f"{mode}: {shlex.join(command)}", file=sys.stderr)
                done = subprocess.run(command, check=False)
                if done.returncode:
                    raise SystemExit(f"the switch command exited {done.returncode}")
            wait_ready(args.url, key)
            if not results:
                warm(args, workload, key)
            results.append(run_mode(mode, args, workload, key, names))
            print(f"{mode}: {results[-1].requests} requests, {results[-1].failures} failed, "
                  f"{results[-1].seconds:.1f} s", file=sys.stderr)
    finally:
        for copy in copies:
            copy.unlink(missing_ok=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"workload": dataclasses.asdict(workload), "modes": [r.figures() for r in results]},
                                        indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
