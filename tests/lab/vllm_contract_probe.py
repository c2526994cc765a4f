"""Run on a lab host by the venv's python (test_lab_contract_vllm.py sends it on stdin): every command
line in sys.argv[1] (JSON: [[id, argv], ...]) parsed by the installed vLLM's own serve parser, then the
running server's /metrics and the parser's option strings. A line of vLLM's own multi-node launch
(--nnodes) is also handed to create_engine_config, its validation of the node count, rank and backend,
with the model swapped for the host's own (sys.argv[3]: the rendered one is not there). Prints one JSON
document. vLLM is imported once: it costs ~20 s on 2 cores."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
import urllib.request


def parser_parts():  # type: ignore[no-untyped-def]
    """The serve parser as `vllm serve` and the server modules build it (0.29-0.32: launchers.cli_args;
    0.33+: common.cli_args; before 0.29: openai.cli_args)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:
        try:
            from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
        except ImportError:
            from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    return FlexibleArgumentParser, make_arg_parser, validate_parsed_serve_args, AsyncEngineArgs


def option_strings() -> list[str]:
    """Every option string the serve parser registers (its `--no-X` and paired forms included)."""
    flexible, make_arg_parser, _, _ = parser_parts()
    return sorted(make_arg_parser(flexible(description="contract"))._option_string_actions)


def judge(argv: list[str], model: str) -> dict[str, object]:
    """{'ok': True} (with 'parallel' for a multi-node line) or {'ok': False, 'error': what vLLM said}."""
    flexible, make_arg_parser, validate, engine_args = parser_parts()
    module = argv[argv.index("-m") + 1]
    if importlib.util.find_spec(module) is None:
        return {"ok": False, "error": f"no module {module} in this vLLM"}
    parser = make_arg_parser(flexible(description="contract"))
    rest = argv[argv.index("-m") + 2:]
    if rest[:1] == ["serve"]:  # vLLM's CLI (`vllm serve`): its serve subcommand is this same parser
        rest = rest[1:]
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = parser.parse_args(rest)
            validate(args)
            parsed = engine_args.from_cli_args(args)
            if "--nnodes" in rest:
                parsed.model, parsed.tokenizer, parsed.served_model_name, parsed.quantization = model, None, None, None
                parallel = parsed.create_engine_config(headless=args.headless).parallel_config
                return {"ok": True, "parallel": {"nnodes": parallel.nnodes, "node_rank": parallel.node_rank,
                                                 "master_addr": parallel.master_addr,
                                                 "master_port": parallel.master_port,
                                                 "backend": parallel.distributed_executor_backend,
                                                 "world_size": parallel.world_size}}
    except SystemExit as exc:
        return {"ok": False, "error": said.getvalue().strip()[-600:] or f"exit {exc.code}"}
    except (ValueError, TypeError, AssertionError) as exc:  # a validator refused: its words are the evidence
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-600:]}
    return {"ok": True}


def main() -> None:
    import vllm

    lines = json.loads(sys.argv[1])
    verdicts = {case: judge(argv, sys.argv[3]) for case, argv in lines}
    metrics = urllib.request.urlopen(sys.argv[2], timeout=30).read().decode()
    print(json.dumps({"vllm": vllm.__version__, "verdicts": verdicts, "metrics": metrics,
                      "options": option_strings()}))


main()
