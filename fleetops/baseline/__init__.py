"""The desired state of a group of GPU nodes, and the thresholds the checks use.

A baseline is YAML: a standalone file, or the ``fleetops_baseline`` variable of an Ansible
inventory's ``group_vars``/``host_vars``. Every key is optional: a key that is absent (or
``null``) is not checked. ``thresholds`` are the exception: each has a default.

Layering: in an inventory, group baselines layer from parent to child. The host's levels are
``all``, then its groups in Ansible's order (depth first, then ``ansible_group_priority``, then
name: a parent before its children), then the host itself; at each level the inventory file's
inline vars come before its ``group_vars``/``host_vars`` files. ``layer`` merges them in that
order: keys a later level sets win, mappings (``thresholds``, ``mig``, ``pcie``, ``fabric``,
``gpu_models`` and each model, ``packages``) merge key by key, lists (``services``,
``stray_process_allowlist``) replace, and an explicit ``null`` unsets the key for that level's
hosts. Each layer is validated on its
own (errors name its file and line); rules that relate two keys (warn below crit) are checked
on the merged result and blame the most specific level. The result remembers which level set
each key (``Baseline.level_of``), which ``fleetops baseline show`` prints. Ansible itself
replaces a dict variable, so a playbook that reads ``fleetops_baseline`` sees only the most
specific level's mapping: the roles get the layered one from ``fleetops`` (see the docs).

``SCHEMA`` describes every key (path, type, default, description, example). The validator is
driven by it, and the docs generator reads it, so the two cannot drift. Errors are
``BaselineError`` and name the source file, the key path (``thresholds.pcie_replays_per_min``)
and the line of the key.

Public API: ``load_file(path)``, ``from_mapping(data, source)``, ``merge(base, override)``,
``layer(layers)``, ``Baseline``, ``Thresholds``, ``SCHEMA``, ``schema_dicts()``,
``json_schema()``, ``flatten(baseline)``, ``BaselineError``.

The modules: ``source`` (YAML with each key's line, ``BaselineError``), ``schema`` (``SCHEMA``
and the JSON Schema), ``validate`` (a mapping checked against ``SCHEMA``), ``values`` (the
``Baseline`` type and its parts), ``load`` (building, merging, layering, flattening). Callers
import this package; the submodules import one another, never the package.
"""

from fleetops.baseline.load import WRAPPER_KEY, flatten, from_mapping, layer, load_file, load_text, merge
from fleetops.baseline.schema import (
    EXAMPLE_ALONE,
    JSON_SCHEMA_ID,
    SCHEMA,
    SCHEMA_BY_PATH,
    SERVICE_FABRICMANAGER,
    SERVICE_PERSISTENCED,
    T_BOOL,
    T_INT,
    T_INT_LIST,
    T_MAP,
    T_MAP_OF,
    T_MAP_OF_VERSION,
    T_MAP_OF_XID,
    T_NUM,
    T_STR,
    T_STR_LIST,
    VALIDATION_FLOOR_METRICS,
    SchemaKey,
    json_schema,
    schema_dicts,
)
from fleetops.baseline.source import BaselineError, read_yaml
from fleetops.baseline.validate import range_problem
from fleetops.baseline.values import (
    DEFAULT_THRESHOLDS,
    Baseline,
    DriverBaseline,
    FabricBaseline,
    GpuModelBaseline,
    MigBaseline,
    MigWant,
    PcieBaseline,
    Thresholds,
    ValidationBaseline,
)

__all__ = [
    "DEFAULT_THRESHOLDS",
    "EXAMPLE_ALONE",
    "JSON_SCHEMA_ID",
    "SCHEMA",
    "SCHEMA_BY_PATH",
    "SERVICE_FABRICMANAGER",
    "SERVICE_PERSISTENCED",
    "T_BOOL",
    "T_INT",
    "T_INT_LIST",
    "T_MAP",
    "T_MAP_OF",
    "T_MAP_OF_VERSION",
    "T_MAP_OF_XID",
    "T_NUM",
    "T_STR",
    "T_STR_LIST",
    "VALIDATION_FLOOR_METRICS",
    "WRAPPER_KEY",
    "Baseline",
    "BaselineError",
    "DriverBaseline",
    "FabricBaseline",
    "GpuModelBaseline",
    "MigBaseline",
    "MigWant",
    "PcieBaseline",
    "SchemaKey",
    "Thresholds",
    "ValidationBaseline",
    "flatten",
    "from_mapping",
    "json_schema",
    "layer",
    "load_file",
    "load_text",
    "merge",
    "range_problem",
    "read_yaml",
    "schema_dicts",
]
