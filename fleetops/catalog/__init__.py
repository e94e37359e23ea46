"""Domain knowledge both sides of fleetops share (the node agent and the controller): the XID
catalog, throttle reasons, the time budgets of actions and the action code of a finding. Plain
data and pure functions; nothing here imports NVML, SSH or a UI, so the agent's cold path and the
checks can both use it."""
