"""The everyday tasks: deploy (rolling, health-gated: provision.rolling), status, bench and logs.
Parse the flags, call the library, print through provision.report."""
from __future__ import annotations

import shlex
import sys
import time

from invoke.context import Context
from invoke.exceptions import Exit

from provision import benchprofiles
from provision.errors import ProvisionError
from provision.taskargs import (
    COMMON_HELP,
    HOST_TASK_FLAGS,
    HostFlags,
    Selection,
    exit_unless,
    guarded,
    help_for,
    host_task,
    select,
    task,
)


@host_task("deploy", *HOST_TASK_FLAGS, "wait",
           help={"batch": "hosts restarted at a time (default 1; a multi-node cluster is one step)",
                 "timeout": "seconds a host may take to answer /health and a completion (default 600)",
                 "wait": "seconds to wait for another run's lock on a host"})
def deploy(c: Context, flags: HostFlags, batch: int = 1, timeout: float = 600) -> None:
    """Roll the inventory out to the hosts, gated on readiness.

    Hosts are brought to the inventory's state without taking them all down."""
    from provision import report, rolling, server
    chosen = flags.select(default_all=True)
    result = rolling.deploy(chosen.inventory, chosen.targets, flags.options(chosen, may_build=True), batch=batch,
                            timeout=timeout, show=report.plans_shower(flags.json))
    report.print_deployed(result, flags.json)
    if not flags.json:
        scope = " ".join(f"--cluster {name}" for name in flags.cluster) if flags.cluster \
            else " ".join(f"--host {name}" for name in result.order)
        # What the hints need to reach the same servers: this run's --inventory and --set.
        same = " ".join([*(["--inventory", shlex.quote(flags.inventory)] if flags.inventory else []),
                         *(f"--set {shlex.quote(item)}" for item in flags.set)])
        key_source = result.held.sources.get("api_key") if result.held.api_key else None
        for name in result.order:
            if result.outcomes[name].state in ("ready", "unchanged"):  # both answered the readiness gate
                report.print_how_to_query(server.how_to_query(
                    name, result.plans[name].host.address, result.plans[name].settings, key_source, scope, same))
                behind = result.plans[name].ctx.behind
                if behind is not None:
                    report.print_how_to_query(server.behind_endpoint(name, behind, key_source, same))
    exit_unless(result.ok)


@host_task("status", "inventory", "host", "cluster", "all", "json", "set",
           help={"watch": "refresh every N seconds until Ctrl-C, which exits 0 (0: once); the table is redrawn "
                          "in place; with --json each refresh is one JSON document on its own line",
                 "timeout": "seconds each host may take (default 5); later ones are marked unreachable",
                 "window": "seconds between the two /metrics samples that give tokens/s (default 1)",
                 "stall-window": "seconds the engine's generated-token count may stand still while requests "
                                 "run before the host is called stuck (default 60, more than --window); a host "
                                 "that looks still is asked again until it moves or this has passed",
                 "wide": "every column (restarts, requests, KV cache, prefix hits) even where the terminal is "
                         "narrower than the table: long cells wrap"})
def status_(c: Context, flags: HostFlags, watch: float = 0, timeout: float = 5, window: float = 1.0,
            stall_window: float = 60.0, wide: bool = False) -> None:  # stall.STALL_WINDOW
    """Show every host at a glance; exit 1 if a server is stuck.

    Unit, restarts, health, model, GPUs, requests, tokens/s, KV and prefix cache, and whether a server
    that answers /health generates anything (if not, it is stuck)."""
    from provision import report, secrets, stall, status
    if window <= 0 or stall_window <= window or watch < 0:
        raise Exit(f"error: --stall-window ({stall_window:g}) must be longer than --window ({window:g}), which "
                   "must be above 0 (a first token after a long prompt takes longer than one window), and "
                   "--watch at least 0", code=2)
    chosen = flags.select(default_all=True)
    held = secrets.load(chosen.inventory.secrets)
    sampling = status.Sampling(window, timeout, stall_window)
    if not watch:
        started = time.monotonic()
        found = status.gather_status(chosen.inventory, chosen.targets, chosen.overrides, held, sampling)
        routed = status.gather_endpoints(chosen.inventory, chosen.targets, timeout)
        report.print_status(found, time.monotonic() - started, flags.json, routed, wide)
        exit_unless(status.serving_as_declared(found) and all(item.answers for item in routed))
        return
    # --watch: each host's samples go to the next refresh, so the stuck rule sees the stall grow live.
    screen = report.StatusScreen(flags.json, wide)
    history: dict[str, tuple[stall.Sample, ...]] = {}
    screen.start()
    try:
        while True:
            started = time.monotonic()
            found = status.gather_status(chosen.inventory, chosen.targets, chosen.overrides, held, sampling,
                                         history)
            screen.show(found, time.monotonic() - started)
            history = {name: stall.keep(item.samples, stall_window) for name, item in found.items()}
            time.sleep(max(0.0, watch - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass  # the person watching ended it: exit 0
    finally:
        screen.stop()


@host_task("bench", "inventory", "cluster", "json", "set", iterable=["arg"],
           help={"host": COMMON_HELP["host"],
                 "cluster": "a cluster of the inventory: the server it serves, on its head (a multi-node "
                            "cluster's workers run none)",
                 "prompt": "the prompt (a number is appended per request)",
                 "count": "requests (default 16)", "concurrency": "requests at once (default 4)",
                 "max-tokens": "tokens per completion (default 32)",
                 "endpoint": "an endpoint of the inventory instead of a host: the load goes through its "
                             "router, from the router's host, to one model's replicas (--model)",
                 "model": "with --endpoint: the model the requests name (default: the endpoint's first)",
                 "profile": "a published benchmark profile, a file (Spark Arena's benchmarking/*.yaml) or a "
                            f"shipped one by name: {benchprofiles.listed()}; run with the tool it names, "
                            "llama-benchy, from this machine against the host's server or the endpoint, each "
                            "depth and concurrency measured as often as its args' runs says (llama-benchy's "
                            "--runs; default 3); cut to the server's context where it cannot hold a run (said)",
                 "book-url": "with --profile: the text llama-benchy cuts its prompts from (default: its own)",
                 "arg": "with --profile: one of its args changed, KEY=VALUE (repeatable; named in the results): "
                        "skip_coherence=true for a model that cannot answer a question, say",
                 "output": "with --profile: where the results go (default: beside the cluster's applied recipe, "
                           "else bench/ beside the inventory); never overwrites"})
def bench(c: Context, flags: HostFlags, host: str | None = None, prompt: str = "Tell me about GPUs",
          count: int = 16, concurrency: int = 4, max_tokens: int = 32, endpoint: str | None = None,
          profile: str | None = None, book_url: str | None = None, output: str | None = None,
          arg: list[str] | None = None, model: str | None = None) -> None:
    """Measure real completions against a server.

    A host's server, a cluster's (on its head) or an endpoint's (through its router): tokens/s, time to
    first token, the server's own figures (a host's only: behind a router they are spread over its
    replicas). With --profile, a published benchmark profile run with llama-benchy, its results kept."""
    from provision import remote, report, secrets, server
    cluster = flags.one_cluster("bench")
    if len([name for name in (host, cluster, endpoint) if name]) != 1:
        raise Exit("error: bench needs --host NAME, --cluster NAME or --endpoint NAME (one of them)", code=2)
    if model and not endpoint:
        raise Exit("error: --model names one of an endpoint's models: it goes with --endpoint NAME", code=2)
    if not profile and (count < 1 or concurrency < 1 or max_tokens < 1):
        raise Exit("error: --count, --concurrency and --max-tokens must be at least 1", code=2)
    chosen = flags.select(targets=False)
    if cluster:  # a cluster serves from its head, as status shows it (the other nodes: workers)
        host = chosen.inventory.cluster(cluster).head
    if profile:
        bench_profile(flags, chosen, host, endpoint, profile, book_url, output, arg or [], model)
        return
    held = secrets.load(chosen.inventory.secrets)
    load = server.Requests(count, concurrency, max_tokens, prompt)

    def progress(event: dict[str, object]) -> None:
        if not flags.json:
            print(f"  {event.get('done')}/{event.get('total')} requests", file=sys.stderr)

    routed = None  # the model the requests name through the endpoint
    if endpoint:
        from provision import endpoints
        plan = endpoints.named(chosen.inventory, endpoint)
        host, routed = plan.host, plan.backend_for(model).model
    runner = remote.connect(chosen.inventory.host(host or ""), chosen.inventory.ssh)
    try:
        result = (server.bench_endpoint(runner, plan, routed, held.api_key, load, progress) if routed else
                  server.bench(runner, chosen.inventory.settings(host or "", chosen.overrides), held.api_key,
                               load, progress))
    except ProvisionError as exc:
        raise Exit(report.host_error(host or "", exc), code=1) from None
    finally:
        runner.close()
    report.print_bench(f"endpoint {endpoint} ({routed}, from {host})" if endpoint else host or "", result,
                       concurrency, flags.json)
    exit_unless(result.succeeded == result.requests)


def bench_profile(flags: HostFlags, chosen: Selection, host: str | None, endpoint: str | None, profile_file: str,
                  book_url: str | None, output: str | None, args: list[str], model: str | None = None) -> None:
    """bench --profile against a host's server or an endpoint: the runs, their results kept (a new file)."""
    import tempfile
    from pathlib import Path

    from provision import benchprofile, benchrun, report, secrets
    from provision.errors import BenchProfileError
    profile = benchprofile.with_args(benchprofile.named(profile_file), benchprofile.parse_args(args))
    benchrun.tool_version()  # installed, or exit 2 before anything connects
    inv = chosen.inventory
    kept = Path(output) if output else benchrun.kept_path(inv, host, endpoint, profile.name)
    if kept.exists():
        raise BenchProfileError("exists already: never overwritten (name another file)", file=str(kept))
    held = secrets.load(inv.secrets)
    with benchrun.connected(inv, host, endpoint, chosen.overrides, model) as served:
        try:
            with tempfile.TemporaryDirectory(prefix="provision-bench-") as work:
                measured = benchrun.run_profile(served, held.api_key, profile, Path(work), book_url,
                                                lambda line: None if flags.json else print(line, file=sys.stderr))
        except ProvisionError as exc:
            raise Exit(report.host_error(served.runner.host, exc), code=1) from None
    benchrun.keep(kept, measured.document)
    report.print_bench_profile(measured.document, str(kept), flags.json)
    exit_unless(measured.ok)


@host_task("ask", "inventory", "json", "set",
           help={"host": "the host whose server to ask", "prompt": "the prompt (default 'Hello, my name is')",
                 "max-tokens": "tokens of the answer (default 16)",
                 "timeout": "seconds the server may take to answer (default 60)"})
def ask(c: Context, flags: HostFlags, host: str | None = None, prompt: str = "Hello, my name is",
        max_tokens: int = 16, timeout: float = 60) -> None:
    """Ask a host's server for one completion and print it.

    Asked on the host (it may listen on loopback only), with the API key the tool holds. Exit 1 when
    the server does not answer."""
    from provision import remote, report, secrets, server
    if not host:
        raise Exit("error: ask needs --host NAME", code=2)
    if max_tokens < 1 or timeout <= 0:
        raise Exit("error: --max-tokens must be at least 1 and --timeout above 0", code=2)
    chosen = flags.select(targets=False)
    target = chosen.inventory.host(host)
    held = secrets.load(chosen.inventory.secrets)
    runner = remote.connect(target, chosen.inventory.ssh)
    try:
        answer = server.ask(runner, chosen.inventory.settings(host, chosen.overrides), held.api_key,
                            prompt, max_tokens, timeout)
    except ProvisionError as exc:
        raise Exit(report.host_error(host, exc), code=1) from None
    finally:
        runner.close()
    report.print_answer(answer, prompt, flags.json)


@task(auto_shortflags=False, name="logs",
      help={**help_for("inventory", "host"), "follow": "keep printing new lines until interrupted",
            "lines": "lines of the journal to show (default 100)",
            "unit": "the host's server unit by default (vllm, llama-server, trtllm-serve, by its engine; a "
                    "cluster's other nodes: vllm-worker, or vllm-ray-worker over Ray); or vllm-ray-head"})
@guarded
def logs(c: Context, host: str | None = None, inventory_: str | None = None, follow: bool = False,
         lines: int = 100, unit: str | None = None) -> None:
    """Show a unit's journal on a host, secrets masked."""
    from provision import engines, remote, report, secrets, server
    if not host:
        raise Exit("error: logs needs --host NAME", code=2)
    if unit is not None and unit not in server.UNITS:
        raise Exit(f"error: --unit must be one of {', '.join(server.UNITS)}, not {unit!r}", code=2)
    chosen = select(inventory_, targets=False)
    if unit is None:
        settings = chosen.inventory.settings(host, {})
        engine = engines.engine_of(settings)
        cluster = chosen.inventory.cluster_of(host)
        worker = engine.worker_unit_for(settings) if cluster and cluster.multi_node and host != cluster.head else None
        unit = chosen.inventory.naming(host).unit(worker or engine.server_unit).removesuffix(".service")
    secrets.load(chosen.inventory.secrets)  # registered for masking
    runner = remote.connect(chosen.inventory.host(host), chosen.inventory.ssh)
    try:
        text = server.journal(runner, unit, lines, follow, lambda line: print(secrets.mask(line), flush=True))
    except ProvisionError as exc:
        raise Exit(report.host_error(host, exc), code=1) from None
    finally:
        runner.close()
    if not follow:
        sys.stdout.write(secrets.mask(text))
