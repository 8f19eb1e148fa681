"""python/mltrain/_capi.py mirrors comm/include/mltrain/comm.h by hand: its enum values and the C
functions it declares must agree with the header, or a ctypes call passes the wrong code."""
import importlib
import re
import sys
from pathlib import Path

from conftest import REPO

HEADER = REPO / "comm" / "include" / "mltrain" / "comm.h"


def header_enums():
    """{enum name: {constant: value}} from comm.h."""
    text = HEADER.read_text()
    enums = {}
    for name, body in re.findall(r"enum\s+(\w+)\s*\{([^}]*)\}", text):
        enums[name] = {c: int(v) for c, v in re.findall(r"(MLTRAIN_\w+)\s*=\s*(-?\d+)", body)}
    return enums


def header_functions():
    """{function: number of parameters} for every function comm.h declares."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    out = {}
    for name, params in re.findall(r"\b(mltrain_\w+)\s*\(([^)]*)\)\s*;", text):
        params = params.strip()
        out[name] = 0 if params in ("", "void") else params.count(",") + 1
    return out


def capi():
    """python/mltrain/_capi.py of this checkout, imported as the package does (it loads the library
    only when asked)."""
    sys.path.insert(0, str(REPO / "python"))
    try:
        module = importlib.import_module("mltrain._capi")
    finally:
        sys.path.pop(0)
    assert Path(module.__file__).resolve() == (REPO / "python" / "mltrain" / "_capi.py").resolve(), module.__file__
    return module


def test_capi_enums_match_comm_h():
    enums, py = header_enums(), capi()
    dtypes = enums["mltrain_dtype"]
    assert dtypes, "no mltrain_dtype in comm.h"
    for const, value in dtypes.items():
        assert getattr(py, const.removeprefix("MLTRAIN_")) == value, const
    assert len(dtypes) == 7
    for const, value in enums["mltrain_redop"].items():
        assert getattr(py, const.removeprefix("MLTRAIN_")) == value, const
    statuses = {v: c.removeprefix("MLTRAIN_COMM_E").lower() for c, v in enums["mltrain_comm_status"].items()
                if c != "MLTRAIN_COMM_OK"}
    assert enums["mltrain_comm_status"]["MLTRAIN_COMM_OK"] == 0
    assert py.STATUS_NAMES == statuses


def test_capi_prototypes_match_comm_h():
    declared, py = header_functions(), capi()
    source = (REPO / "python" / "mltrain" / "_capi.py").read_text()
    protos = dict(re.findall(r'"(mltrain_\w+)":\s*\(\[([^\]]*)\]', source))
    assert protos, "no prototypes found in _capi.py"
    for name, args in protos.items():
        assert name in declared, f"_capi.py declares {name}, which comm.h does not"
        count = 0 if not args.strip() else args.count(",") + 1
        assert count == declared[name], f"{name}: _capi.py passes {count} arguments, comm.h takes {declared[name]}"
    assert py.LIB_NAME == "libmltrain-comm.so.0"
