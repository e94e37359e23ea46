"""Building a ``Baseline``: from a mapping or a file (``from_mapping``, ``load_file``,
``load_text``), merged over another (``merge``), layered from an inventory's levels (``layer``),
and flattened back to key paths (``flatten``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from fleetops.baseline.schema import SERVICE_FABRICMANAGER, SERVICE_PERSISTENCED
from fleetops.baseline.source import BaselineError, mapping_line, read_yaml
from fleetops.baseline.validate import Validator, fmt_path, type_name
from fleetops.baseline.values import (
    Baseline,
    DriverBaseline,
    FabricBaseline,
    GpuModelBaseline,
    MigBaseline,
    PcieBaseline,
    Thresholds,
    ValidationBaseline,
)
from fleetops.catalog import mig as _mig_catalog
from fleetops.catalog import migparted as _migparted
from fleetops.validation import floors as _floors  # plain data, cheap for the agent's cold path
from fleetops.xid import catalog as _xid
from fleetops.xid import policy as _xpolicy

WRAPPER_KEY = "fleetops_baseline"


def _validation(raw: Mapping[str, Any] | None) -> ValidationBaseline:
    raw = raw or {}
    floors: dict[str, dict[str, float]] = {}
    for name, metrics in (raw.get("floors") or {}).items():
        key = name if name in _floors.SHIPPED else (_floors.model_key(name) or name)
        floors.setdefault(key, {}).update({m: float(v) for m, v in (metrics or {}).items() if v is not None})
    return ValidationBaseline(require=raw.get("require"), max_age_days=raw.get("max_age_days"), floors=floors)


def _fabric(raw: Mapping[str, Any] | None) -> FabricBaseline:
    raw = raw or {}
    devices, layers = raw.get("exclude_devices"), raw.get("exclude_link_layers")
    return FabricBaseline(
        compute_ports=raw.get("compute_ports"), link_layer=raw.get("link_layer"), rate_gbps=raw.get("rate_gbps"),
        width=raw.get("width"), firmware=raw.get("firmware"),
        exclude_devices=tuple(devices) if devices is not None else None,
        exclude_link_layers=tuple(layers) if layers is not None else None,
    )


# Pairs (warn, crit) that must be ordered.
_ORDERED = (
    ("ecc_sbe_volatile_warn", "ecc_sbe_volatile_crit"),
    ("nvlink_crc_per_min_warn", "nvlink_crc_per_min_crit"),
)


def _build(
    raw: Mapping[str, Any],
    source: str,
    origins: Mapping[str, tuple[str, int | None]],
    recent: Mapping[str, Any] | None = None,
    levels: Mapping[str, str] | None = None,
) -> Baseline:
    """``recent``: the origins of the last layer merged, blamed first for a conflict."""
    th_raw = raw.get("thresholds") or {}
    thresholds = Thresholds(**{k: v for k, v in th_raw.items()})
    for low, high in _ORDERED:
        if getattr(thresholds, low) > getattr(thresholds, high):
            candidates = [f"thresholds.{k}" for k in (high, low) if k in th_raw]
            fresh = [c for c in candidates if recent is not None and c in recent]
            path = (fresh or candidates or [f"thresholds.{low}"])[0]
            src, line = origins.get(path, (source, None))
            raise BaselineError(
                src, path,
                f"{low} ({getattr(thresholds, low):g}) must not exceed {high} ({getattr(thresholds, high):g})",
                line,
            )
    models = {
        name: GpuModelBaseline(**{k: v for k, v in (spec or {}).items() if k not in ("mig", "fabric")},
                               mig=_mig(spec.get("mig"), source, origins, f'gpu_models["{name}"].mig')
                               if (spec or {}).get("mig") is not None else None,
                               fabric=_fabric(spec["fabric"]) if (spec or {}).get("fabric") is not None else None)
        for name, spec in (raw.get("gpu_models") or {}).items()
    }
    mig = _mig(raw.get("mig"), source, origins, "mig")
    pcie = PcieBaseline(**(raw.get("pcie") or {}))
    nvlinks = raw.get("nvlinks_per_gpu")
    if raw.get("services") is not None:
        services = tuple(raw["services"])
    else:
        services = (SERVICE_PERSISTENCED,) + ((SERVICE_FABRICMANAGER,) if nvlinks else ())
    allow = raw.get("stray_process_allowlist")
    policy = _xid_policy(raw.get("xid_policy") or {}, source, origins)
    driver_raw = raw.get("driver") or {}
    branches = driver_raw.get("branches")
    driver = DriverBaseline(branches=tuple(branches) if branches is not None else None,
                            flavour=driver_raw.get("flavour"))
    return Baseline(
        driver_version=raw.get("driver_version"),
        cuda_driver_version=raw.get("cuda_driver_version"),
        fabric_manager_version=raw.get("fabric_manager_version"),
        gpu_models=models,
        power_limit_w=raw.get("power_limit_w"),
        persistence_mode=raw.get("persistence_mode"),
        ecc_mode=raw.get("ecc_mode"),
        compute_mode=raw.get("compute_mode"),
        mig=mig,
        gpu_count=raw.get("gpu_count"),
        pcie=pcie,
        nvlinks_per_gpu=nvlinks,
        expected_topology=raw.get("expected_topology"),
        stray_process_allowlist=tuple(allow) if allow is not None else None,
        services=services,
        driver=driver,
        packages={name: v for name, v in (raw.get("packages") or {}).items() if v is not None},
        thresholds=thresholds,
        xid_policy=policy,
        validation=_validation(raw.get("validation")),
        fabric=_fabric(raw.get("fabric")),
        source=source,
        raw=_plain(raw),
        origins=dict(origins),
        levels=dict(levels or {}),
    )


def _mig(raw: Mapping[str, Any] | None, source: str, origins: Mapping[str, tuple[str, int | None]],
         path: str) -> MigBaseline:
    """The rules between mig keys, and the mig-parted config read and selected (so a bad file
    or a config name it lacks is an error at load time, naming the baseline key's line)."""
    raw = raw or {}

    def fail(key: str, problem: str) -> NoReturn:
        src, line = origins.get(f"{path}.{key}", (source, None))
        raise BaselineError(src, f"{path}.{key}", problem, line)

    layout = raw.get("layout")
    if layout is not None and raw.get("mode") is False:
        fail("layout", "a layout needs MIG mode: mig.mode is false")
    if layout is not None and raw.get("config_file") is not None:
        fail("config_file", "give the layout once: mig.layout or mig.config_file, not both")
    if (raw.get("config_file") is None) != (raw.get("config") is None):
        fail("config" if raw.get("config") is None else "config_file",
             "mig.config_file and mig.config go together (the file, and the config in it to use)")
    parted = None
    if raw.get("config_file") is not None:
        import os

        src, line = origins.get(f"{path}.config_file", (source, None))
        where = raw["config_file"]
        if not os.path.isabs(where) and src and os.path.exists(src):
            where = os.path.join(os.path.dirname(os.path.abspath(src)), where)
        try:
            parsed = _migparted.load(where)
        except _migparted.MigPartedError as exc:
            raise BaselineError(src, f"{path}.config_file", str(exc), line) from None
        try:
            parted = parsed.select(raw["config"])
        except _migparted.MigPartedError as exc:
            fail("config", str(exc))
    return MigBaseline(mode=raw.get("mode"), profile=raw.get("profile"),
                       layout=tuple(_mig_catalog.normalize(p) for p in layout) if layout is not None else None,
                       config_file=raw.get("config_file"), config=raw.get("config"), parted=parted)



def _xid_policy(
    raw: Mapping[str, Any], source: str, origins: Mapping[str, tuple[str, int | None]]
) -> dict[int, _xpolicy.XidPolicy]:
    out: dict[int, _xpolicy.XidPolicy] = {}
    for code, spec in raw.items():
        spec = spec or {}
        esc = spec.get("escalate")
        escalation = None
        if esc:
            missing = [k for k in ("count", "within_s") if esc.get(k) is None]
            if missing:
                path = f'xid_policy["{code}"].escalate'
                src, line = origins.get(path, (source, None))
                raise BaselineError(src, path, f"needs {' and '.join(missing)}", line)
            base = _xid.lookup(int(code))
            escalation = _xpolicy.Escalation(
                int(esc["count"]), float(esc["within_s"]), esc.get("severity") or "crit",
                esc.get("action") or spec.get("action") or base.action,
            )
        out[int(code)] = _xpolicy.XidPolicy(spec.get("severity"), spec.get("action"), escalation)
    return out


def from_mapping(data: Any, source: str) -> Baseline:
    """Validate a baseline mapping (the value of ``fleetops_baseline``, or a document holding
    that key) and build a ``Baseline``. ``source`` names where it came from, for errors.
    ``None`` or an empty mapping is a baseline with nothing pinned."""
    if data is None:
        data = {}
    if isinstance(data, dict) and WRAPPER_KEY in data:
        data = data[WRAPPER_KEY]
        if data is None:
            data = {}
    validator = Validator(source)
    raw = validator.mapping(data, "", "", mapping_line(data))
    return _build(raw, source, validator.origins)


def load_file(path: str) -> Baseline:
    """Load a baseline from YAML: a standalone baseline, or a group_vars file whose
    ``fleetops_baseline`` key holds it (the file's other variables are ignored).

    A file that is a JSON object (JSON is YAML too) is read without PyYAML: the node agent's
    environment has no PyYAML (nodes get only the agent and NVML's bindings), and the
    fleetops_agent role writes the daemon's baseline as JSON for that reason."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise BaselineError(path, "", f"cannot read: {exc.strerror or exc}") from exc
    return load_text(text, path)


def load_text(text: str, path: str) -> Baseline:
    """``load_file`` for a baseline already read (``fleetops-agent check --baseline -`` reads
    stdin); ``path`` names it in errors and as the baseline's source."""
    if text.lstrip().startswith("{"):
        import json

        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BaselineError(path, "", f"not valid JSON: {exc.msg}", exc.lineno) from exc
        return from_mapping(doc, path)
    try:
        import yaml
    except ModuleNotFoundError as exc:
        raise BaselineError(path, "", "PyYAML is not installed here: give the baseline as JSON, "
                            "or install PyYAML beside the agent") from exc
    try:
        data = read_yaml(text, path)
    except BaselineError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise BaselineError(path, "", f"not valid YAML: {exc.problem or exc}", line) from exc
    except yaml.YAMLError as exc:
        raise BaselineError(path, "", f"not valid YAML: {exc}") from exc
    if data is None:
        return from_mapping({}, path)
    if not isinstance(data, dict):
        raise BaselineError(path, "", f"a baseline is a mapping, got {type_name(data)}", 1)
    return from_mapping(data, path)


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value  # scalars and lists replace; an explicit null unsets
    return out


def merge(base: Baseline, override: Baseline) -> Baseline:
    """Layer ``override`` (a more specific group) over ``base``: keys ``override`` sets win,
    mappings (thresholds, mig, pcie, gpu_models and each model, packages) merge key by key, lists
    replace, and an explicit ``null`` unsets. Defaults never override explicit values."""
    raw = _deep_merge(_plain(base.raw), _plain(override.raw))
    origins = {**base.origins, **override.origins}
    sources = [s for s in (base.source, override.source) if s and s != "<defaults>"]
    return _build(raw, " + ".join(sources) or "<defaults>", origins, recent=override.origins,
                  levels={**base.levels, **override.levels})


def layer(layers: Sequence[tuple[str, str, Any]]) -> Baseline:
    """Merge baselines given as ``(level, source, mapping)`` from the least to the most specific
    (an inventory's ``all``, its groups parent to child, the host): see the module docstring.
    ``source`` is the file each came from, for errors; ``level`` is remembered per key. No
    layers is a baseline with nothing pinned."""
    raw: dict[str, Any] = {}
    origins: dict[str, tuple[str, int | None]] = {}
    levels: dict[str, str] = {}
    recent: dict[str, tuple[str, int | None]] = {}
    for level, source, data in layers:
        if isinstance(data, dict) and WRAPPER_KEY in data:
            data = data[WRAPPER_KEY]
        if data is None:
            data = {}
        validator = Validator(source)
        one = validator.mapping(data, "", "", mapping_line(data))
        raw = _deep_merge(raw, one)
        origins.update(validator.origins)
        levels.update({path: level for path in validator.origins})
        recent = validator.origins
    sources = list(dict.fromkeys(source for _, source, _ in layers))
    return _build(raw, " + ".join(sources) or "<defaults>", origins, recent=recent, levels=levels)


def flatten(b: Baseline) -> list[tuple[str, Any]]:
    """The keys a baseline sets explicitly, as ``(path, value)`` in document order: leaves, and
    mappings set to ``null`` or left empty. Paths are those errors and ``origin`` use
    (``gpu_models["NVIDIA H200"].power_limit_w``)."""
    out: list[tuple[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, sub in value.items():
                walk(fmt_path(prefix, str(key)), sub)
        else:
            out.append((prefix, value))

    for key, value in b.raw.items():
        walk(fmt_path("", key), value)
    return out


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj
