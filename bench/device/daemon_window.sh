#!/bin/sh
# Read-only, on a lent GPU machine after readonly_checks.sh (its /tmp/vi venv): the NVML daemon for
# 25 s, then its answer through `collect`: where the snapshot came from, the rate base it judged
# against (rate_since), the MIG instances it samples and its findings. Results go to $OUT.
export PYTHONPATH="$PWD"
S=/tmp/fleetops-dw.sock
/tmp/vi/bin/python -m fleetops.agent.main serve --backend nvml --socket "$S" --interval 2 --full-interval 10 > "$OUT/serve.log" 2>&1 &
P=$!
sleep 25
/tmp/vi/bin/python -m fleetops.agent.main collect --socket "$S" --max-age 30 --json > "$OUT/daemon_collect.json"; echo "collect from the daemon: rc=$?"
kill -TERM $P; wait $P; echo "daemon exit: $?"
/tmp/vi/bin/python - "$OUT/daemon_collect.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
d = doc.get("daemon") or {}
print("served by daemon:", bool(d), "age_s", d.get("age_s"), "window_s", round(doc["collected_at"] - (d.get("rate_since") or 0), 1) if d.get("rate_since") else None)
print("mig:", json.dumps(doc.get("mig")))
print("findings:", [(f["check"], f["severity"]) for f in d.get("findings", [])])
print("gpus:", [(g["name"], g.get("mig_mode_current")) for g in doc["gpus"]])
PY
