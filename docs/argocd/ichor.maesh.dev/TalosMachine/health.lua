-- Argo CD health of an Ichor TalosMachine (ichor.maesh.dev). Ichor's controller
-- writes Ready, Reconciling and Stalled the same way for every kind:
-- Reconciling=True while work is under way, Stalled=True on a failure that
-- needs someone, Ready=True when done, Ready=False on a failure it retries.
-- Only Lua's base and table libraries are used (argocd-cm scripts run
-- without the others).
local hs = {}
local function find(conditions, type)
  for _, c in ipairs(conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Ichor controller to report a status"
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and observed ~= nil and observed < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the Ichor controller to observe generation " .. generation
  return hs
end
local conditions = obj.status.conditions
local ready = find(conditions, "Ready")
local reconciling = find(conditions, "Reconciling")
local stalled = find(conditions, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.reason .. ": " .. stalled.message
  return hs
end
if ready ~= nil and ready.status == "False" then
  hs.status = "Degraded"
  hs.message = ready.reason .. ": " .. ready.message
  return hs
end
if obj.spec ~= nil and obj.spec.hold == true then
  hs.status = "Suspended"
  local drifted = find(conditions, "Drifted")
  if drifted ~= nil and drifted.status == "True" then
    hs.message = "Held (spec.hold is true), with drift: " .. drifted.message
  else
    hs.message = "Held (spec.hold is true): Ichor writes nothing to this node"
  end
  return hs
end
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = reconciling.reason .. ": " .. reconciling.message
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message
  return hs
end
hs.status = "Progressing"
hs.message = "Waiting for the Ichor controller to settle Ready"
return hs
