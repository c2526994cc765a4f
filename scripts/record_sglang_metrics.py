"""Record two /metrics pages written by SGLang 0.5.23's own metrics code, without a server.

No GPU, so no SGLang server: this program runs the wheel's Prometheus code in-process instead. In a
temporary PROMETHEUS_MULTIPROC_DIR (made by SGLang's `set_prometheus_multiproc_dir`) it builds the
scheduler collector with `SchedulerMetricsCollector.init_new` and the tokenizer collector with
`TokenizerMetricsCollector(labels=tokenizer_metric_labels(), ...)` for a model served as "lab/tiny",
logs a `SchedulerStats` with `log_stats` and finished requests with `observe_one_finished_request`,
and writes the page as SGLang's /metrics does (`add_prometheus_middleware`: a CollectorRegistry with
a `multiprocess.MultiProcessCollector`, exposed by prometheus_client's `generate_latest`); then it
logs more and writes a second page. The JSON (source, notes, window, first, second) is the style of
tests/fixtures/metrics/*.json. The window is a stated 1.0 s: no server ran, no time passed.

Two things stand in for what a CPU machine cannot import (the wheel's module imports reach CUDA-only
packages): `sglang.srt.disaggregation.utils` (only `DisaggregationMode.to_engine_type`, answering
"unified", as SGLang does without PD disaggregation) and `sglang.srt.model_executor.forward_batch_info`
(`ForwardMode`, unused by the calls made); and the config accessors metrics_collector.py reads
(get_serving, get_parallel, ...) answer from the parsed, unresolved ServerArgs plus rank 0, since
publishing the runtime context needs model resolution. Every metric, label and sample is SGLang's.

Run (SGLang's wheel unpacked, prometheus-client >= 0.20.0 and the wheel's light deps on the path):

    PYTHONPATH=/path/to/unpacked/sglang-wheel:/path/to/deps python3 \\
        scripts/record_sglang_metrics.py --out tests/fixtures/metrics/sglang-0.5.23-collectors.json
"""
from __future__ import annotations

import argparse
import enum
import importlib
import importlib.metadata
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

MODEL = "lab/tiny"
WINDOW = 1.0


class _Bag:
    """A config namespace read from the parsed ServerArgs, with the given values first."""

    def __init__(self, server_args: Any, **values: Any) -> None:
        self._server_args, self._values = server_args, values

    def __getattr__(self, name: str) -> Any:
        if name in self._values:
            return self._values[name]
        return getattr(self._server_args, name)


def _stand_ins() -> None:
    """The two modules metrics_collector.py imports that pull in CUDA-only packages."""
    disagg = types.ModuleType("sglang.srt.disaggregation.utils")

    class DisaggregationMode(enum.Enum):
        NULL = "null"

        @staticmethod
        def to_engine_type(mode: Any) -> str:
            return "unified"  # sglang/srt/disaggregation/utils.py:156-161 without PD disaggregation

    disagg.DisaggregationMode = DisaggregationMode  # type: ignore[attr-defined]
    batch_info = types.ModuleType("sglang.srt.model_executor.forward_batch_info")
    batch_info.ForwardMode = None  # type: ignore[attr-defined]
    sys.modules.setdefault(disagg.__name__, disagg)
    sys.modules.setdefault(batch_info.__name__, batch_info)


def record() -> dict[str, Any]:
    if "prometheus_client" in sys.modules:
        raise SystemExit("prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set")
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    utils = importlib.import_module("sglang.srt.utils")
    utils.set_prometheus_multiproc_dir()  # a TemporaryDirectory, as the server's launch does
    _stand_ins()
    mc = importlib.import_module("sglang.srt.observability.metrics_collector")
    server_args = importlib.import_module("sglang.srt.server_args").prepare_server_args(
        ["--model-path", MODEL, "--served-model-name", MODEL, "--enable-metrics"])
    ranks = {"tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0, "attn_tp_rank": 0, "attn_cp_rank": 0,
             "dp_rank": None}
    mc.get_parallel = lambda: _Bag(server_args, **ranks)
    for name in ("get_serving", "get_observability", "get_schedule"):
        setattr(mc, name, lambda: _Bag(server_args))
    mc.get_disagg = lambda: _Bag(server_args, disaggregation_mode="null", enable_pd_role_switch=False)
    mc.exports_expert_balancedness_to_prometheus = lambda: False

    context = mc.SchedulerMetricsCollector.init_new(
        server_args=server_args, enable_priority_scheduling=False, enable_lora=False,
        enable_hierarchical_cache=False)
    scheduler = context.collector
    observability = mc.get_observability()
    tokenizer = mc.TokenizerMetricsCollector(
        server_args=server_args, labels=mc.tokenizer_metric_labels(),
        bucket_time_to_first_token=observability.bucket_time_to_first_token,
        bucket_e2e_request_latency=observability.bucket_e2e_request_latency,
        bucket_inter_token_latency=observability.bucket_inter_token_latency)

    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()  # sglang/srt/utils/common.py add_prometheus_middleware
    multiprocess.MultiProcessCollector(registry)

    def page() -> str:
        return generate_latest(registry).decode()

    def finish(prompt: int, generated: int, cached: int) -> None:
        tokenizer.observe_one_finished_request(
            dict(tokenizer.labels), prompt, generated, cached, e2e_latency=0.5, has_grammar=False,
            cached_tokens_details={"device": cached, "host": 0} if cached else None)

    def stats(running: int, queued: int, usage: float, hit_rate: float) -> Any:
        return mc.SchedulerStats(
            num_running_reqs=mc.QueueCount(total=running), num_queue_reqs=mc.QueueCount(total=queued),
            token_usage=usage, full_token_usage=usage, cache_hit_rate=hit_rate, gen_throughput=180.0)

    scheduler.log_stats(stats(running=3, queued=1, usage=0.25, hit_rate=0.4))
    for prompt, generated, cached in ((120, 64, 0), (120, 64, 96), (200, 32, 96)):
        finish(prompt, generated, cached)
    first = page()
    scheduler.log_stats(stats(running=4, queued=2, usage=0.375, hit_rate=0.5))
    for prompt, generated, cached in ((120, 64, 112), (300, 128, 0), (120, 64, 112)):
        finish(prompt, generated, cached)
    second = page()
    prometheus = importlib.metadata.version("prometheus-client")
    return {
        "source": (
            "SGLang 0.5.23's own metrics code (wheel sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64) "
            f"run in-process with prometheus-client {prometheus} by scripts/record_sglang_metrics.py, "
            "without a server: not a server's answer. set_prometheus_multiproc_dir; "
            "SchedulerMetricsCollector.init_new (labels model_name, engine_type, tp_rank, pp_rank, "
            "moe_ep_rank) and TokenizerMetricsCollector(labels=tokenizer_metric_labels()) for a model "
            f"served as {MODEL!r}; SchedulerMetricsCollector.log_stats(SchedulerStats) and "
            "TokenizerMetricsCollector.observe_one_finished_request; each page is generate_latest over "
            "a CollectorRegistry with multiprocess.MultiProcessCollector, as add_prometheus_middleware "
            "serves /metrics. Stand-ins, because the wheel's imports reach CUDA-only packages: "
            "sglang.srt.disaggregation.utils (DisaggregationMode.to_engine_type -> 'unified') and "
            "sglang.srt.model_executor.forward_batch_info (ForwardMode, unused); the config accessors "
            "metrics_collector.py reads (get_serving, get_parallel, get_observability, get_schedule, "
            "get_disagg) answer from the parsed, unresolved ServerArgs with rank 0, and "
            "exports_expert_balancedness_to_prometheus() with False."),
        "notes": (
            "First page: log_stats(running 3, queued 1, token_usage 0.25, cache_hit_rate 0.4) and three "
            "finished requests (prompt/generated/cached tokens 120/64/0, 120/64/96, 200/32/96); second "
            "page: log_stats(running 4, queued 2, token_usage 0.375, cache_hit_rate 0.5) and three more "
            "(120/64/112, 300/128/0, 120/64/112). Counters carry is_streaming (tokens) or cache_source "
            "(cached tokens) labels; prompt_tokens_total counts cached tokens too. SGLang counts no "
            "failed requests (num_aborted_requests_total is aborts). The window is stated, not timed."),
        "window": WINDOW,
        "first": first,
        "second": second,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="the JSON recording to write")
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(record(), indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
