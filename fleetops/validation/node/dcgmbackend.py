"""The DCGM backend: ``dcgmi diag`` at the level asked, its JSON read into the agent's result
shape. Used where neither PyTorch nor CuPy has CUDA here; DCGM's tests are pass/fail, so the
result carries an outcome per test instead of figures."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

RUN_LEVEL = {"quick": "2", "full": "3"}
# A diag can hang on a bad GPU: every run has a bound, under the controller's SSH timeout for
# the level. r3 takes about 15 minutes on an 8-GPU node, more than the full level's budget: on
# such nodes the run is recorded as timed out (unknown), never as failed.
TIMEOUT_S = {"quick": 115.0, "full": 700.0}
OUTCOMES = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip", "skipped": "skip"}


class DcgmError(Exception):
    pass


def available() -> str | None:
    return None if shutil.which("dcgmi") else "dcgmi (DCGM) is not on PATH"


def argv(level: str, gpu_index: int | None) -> list[str]:
    out = ["dcgmi", "diag", "-r", RUN_LEVEL[level], "-j"]
    if gpu_index is not None:
        out += ["-i", str(gpu_index)]
    return out


def _document(stdout: str) -> dict[str, Any]:
    """The JSON object in dcgmi's stdout; DCGM 3.x prints a status line before it."""
    start = stdout.find("{")
    if start < 0:
        raise DcgmError("dcgmi printed no JSON")
    try:
        doc = json.loads(stdout[start:])
    except json.JSONDecodeError as exc:
        raise DcgmError(f"dcgmi printed JSON that does not parse: {exc}") from exc
    if not isinstance(doc, dict):
        raise DcgmError("dcgmi's JSON is not an object")
    return doc


def _messages(result: dict[str, Any]) -> list[str]:
    out = []
    for key in ("warnings", "info"):
        for item in result.get(key) or []:
            if isinstance(item, dict):
                text = str(item.get("warning") or item.get("message") or item.get("info") or "")
                if item.get("error_id") is not None:
                    text = f"{text} (DCGM error {item['error_id']})"
                out.append(text)
            else:
                out.append(str(item))
    return out


def _entity_ids(result: dict[str, Any]) -> list[int] | None:
    """GPU ids a result entry covers; None for an entry about the whole node."""
    if "entity_id" in result:
        if str(result.get("entity_group", "GPU")).upper() != "GPU":
            return []
        return [int(result["entity_id"])]
    if "gpu_ids" in result or "gpu_id" in result:
        raw = str(result.get("gpu_ids", result.get("gpu_id", "")))
        ids = [int(x) for x in raw.replace(" ", "").split(",") if x.isdigit()]
        return ids or None
    return None


def parse(doc: dict[str, Any]) -> tuple[dict[int, dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Per GPU id: ``{"dcgm_<test>": {"outcome", "messages", "category"}}``; the tests about the
    whole node; and DCGM's version and the driver it saw. Reads the DCGM 4.x document (top key
    "DCGM Diagnostic", results per entity) and the 3.x one ("DCGM GPU Diagnostic", gpu_ids)."""
    body = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic")
    if not isinstance(body, dict) or not isinstance(body.get("test_categories"), list):
        raise DcgmError("dcgmi's JSON has no test_categories under 'DCGM Diagnostic' or 'DCGM GPU Diagnostic'")
    per_gpu: dict[int, dict[str, Any]] = {}
    node: dict[str, Any] = {}
    for cat in body["test_categories"]:
        category = str(cat.get("category", ""))
        for test in cat.get("tests") or []:
            key = "dcgm_" + str(test.get("name", "test")).strip().lower().replace(" ", "_").replace("/", "_")
            for result in test.get("results") or []:
                status = str(result.get("status", "")).strip().lower()
                entry = {"outcome": OUTCOMES.get(status, "unknown"), "status": result.get("status"),
                         "messages": _messages(result), "category": category}
                ids = _entity_ids(result)
                if ids is None:
                    node[key] = entry
                for i in ids or []:
                    per_gpu.setdefault(i, {})[key] = entry
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else body
    info = {"dcgm": meta.get("version") or meta.get("DCGM Version"),
            "driver": meta.get("Driver Version Detected") or meta.get("driver_version_detected")}
    return per_gpu, node, info


def run(level: str, gpus: list[dict[str, Any]], gpu_index: int | None) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    cmd = argv(level, gpu_index)
    by_index = {int(g["index"]): g for g in gpus}
    prov: dict[str, Any] = {"backend": "dcgm", "argv": cmd, "versions": {}, "driver": None}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S[level], check=False)
    except subprocess.TimeoutExpired:
        why = f"dcgmi diag -r {RUN_LEVEL[level]} did not finish in {TIMEOUT_S[level]:.0f} s"
        return _all_unknown(by_index, gpu_index, why), {"dcgm": {"error": why}}, prov
    except OSError as exc:
        return _all_unknown(by_index, gpu_index, f"dcgmi: {exc}"), {"dcgm": {"error": str(exc)}}, prov
    prov["exit_code"] = proc.returncode
    try:
        per_gpu, node_tests, info = parse(_document(proc.stdout))
    except DcgmError as exc:
        why = f"{exc} (exit {proc.returncode}; stderr: {proc.stderr.strip()[:200]})"
        return _all_unknown(by_index, gpu_index, why), {"dcgm": {"error": why}}, prov
    prov["versions"] = {"dcgm": info["dcgm"]}
    prov["driver"] = info["driver"]
    results = []
    for i in sorted(set(per_gpu) | ({gpu_index} if gpu_index is not None else set(by_index))):
        ident = by_index.get(i, {"index": i, "uuid": f"dcgm-gpu-{i}", "bus_id": "", "name": None})
        results.append({**ident, "tests": per_gpu.get(i, {})})
    p2p_na = {"skipped": "the dcgm backend reports DCGM's own tests; P2P and all_reduce figures need torch or CuPy"}
    return results, {"p2p": p2p_na, "allreduce": dict(p2p_na), "dcgm": {"tests": node_tests}}, prov


def _all_unknown(by_index: dict[int, dict[str, Any]], gpu_index: int | None, why: str) -> list[dict[str, Any]]:
    ids = [gpu_index] if gpu_index is not None else sorted(by_index)
    if not ids:
        # NVML named no GPU either: one entry for the node, so the run cannot read as clean.
        return [{"index": None, "uuid": "dcgm-node", "bus_id": "", "name": None, "tests": {"dcgm_diag": {"error": why}}}]
    return [{**by_index.get(i, {"index": i, "uuid": f"dcgm-gpu-{i}", "bus_id": "", "name": None}),
             "tests": {"dcgm_diag": {"error": why}}} for i in ids]
