"""A source build on lab hosts: built once on one host of the architecture, the wheel distributed to the
others, imported from every venv. A small real package with a C extension stands in for vLLM: the
mechanics (source shipped, build tools from the wheelhouse, MAX_JOBS, wheel back, push by hash) are
the same."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import inventory
from tests.lab.conftest import on_host, run_invoke

pytestmark = pytest.mark.lab

HOSTS = ("ws-5090", "cpu-1")
SOURCE_C = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b + OFFSET);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, "a + b"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastsum", NULL, -1, methods};
PyMODINIT_FUNC PyInit__fastsum(void) { return PyModule_Create(&module); }
"""


def make_package(directory: Path, offset: int) -> Path:
    (directory / "fastsum").mkdir(parents=True, exist_ok=True)
    (directory / "fastsum" / "__init__.py").write_text("from fastsum._fastsum import add\n__version__ = '1.0'\n")
    (directory / "fastsum" / "_fastsum.c").write_text(SOURCE_C.replace("OFFSET", str(offset)))
    (directory / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61", "wheel"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "fastsum"\nversion = "1.0"\n')
    (directory / "setup.py").write_text(
        "from setuptools import Extension, setup\n"
        "setup(packages=['fastsum'], ext_modules=[Extension('fastsum._fastsum', ['fastsum/_fastsum.c'])])\n")
    return directory


def venv_run(source: Path) -> tuple[int, dict, str]:
    # One profile for both, so one build serves both (a GPU profile's TORCH_CUDA_ARCH_LIST is part
    # of what is built: ws-5090 as an RTX 5090 would need a build of its own).
    args = ["venv", "--json", "--profile", "cpu", *(arg for host in HOSTS for arg in ("--host", host)),
            "--set", f"venv_source={source}", "--set", "venv_dir=/opt/fastsum", "--set", "engine_spec=null"]
    done = run_invoke(*args)
    try:
        return done.returncode, json.loads(done.stdout), done.stdout + done.stderr
    except json.JSONDecodeError:
        return done.returncode, {}, done.stdout + done.stderr


def builds_on(inv: inventory.Inventory) -> dict[str, list[str]]:
    script = "ls -d /var/cache/provision/build/*/ 2>/dev/null | xargs -r -n1 basename"
    return {host: on_host(inv, host, ["sh", "-c", script]).split() for host in HOSTS}


def test_a_source_is_built_once_per_architecture_and_installed_everywhere(
        lab_inventory: inventory.Inventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISION_WHEELHOUSE", str(tmp_path / "wheelhouse"))  # nothing built before
    for host in HOSTS:
        on_host(lab_inventory, host, ["sh", "-c", "rm -rf /opt/fastsum* /var/cache/provision/build"])
    source = make_package(tmp_path / "fastsum", offset=0)
    code, report, text = venv_run(source)
    assert code == 0, text
    built = builds_on(lab_inventory)
    assert sorted(len(keys) for keys in built.values()) == [0, 1], built  # one build host, one build
    for host in HOSTS:
        assert report["hosts"][host]["applied"] == 1
        answer = on_host(lab_inventory, host, ["/opt/fastsum/bin/python", "-c",
                                                "import fastsum, fastsum._fastsum as m; print(fastsum.add(2, 3), m.__file__)"])
        total, module = answer.split()
        assert total == "5" and module.endswith(".so")  # the compiled extension, not a pure-Python stand-in
    # The same source again: nothing built, nothing installed.
    code, report, text = venv_run(source)
    assert code == 0 and all(report["hosts"][h]["changes"] == [] for h in HOSTS), text
    assert builds_on(lab_inventory) == built
    # A changed source: built once more, and every venv runs the new code.
    make_package(source, offset=100)
    code, report, text = venv_run(source)
    assert code == 0, text
    assert sum(len(keys) for keys in builds_on(lab_inventory).values()) == 2
    for host in HOSTS:
        assert on_host(lab_inventory, host, ["/opt/fastsum/bin/python", "-c",
                                             "import fastsum; print(fastsum.add(2, 3))"]).strip() == "105"


@pytest.mark.usefixtures("the_lab")  # a lab test like the others: PROVISION_SKIP_LAB=1 skips it too
def test_a_source_that_does_not_compile_fails_with_the_compilers_words(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISION_WHEELHOUSE", str(tmp_path / "wheelhouse"))
    source = make_package(tmp_path / "fastsum", offset=0)
    (source / "fastsum" / "_fastsum.c").write_text("this is not C;\n")
    code, _, text = venv_run(source)
    assert code == 1
    assert "building the wheel failed" in text and "error" in text.lower()
