#!/usr/bin/env bash
# Validates the Kubernetes manifests in deploy/k8s, without a cluster:
#  1. schema: each manifest against the Kubernetes OpenAPI schemas with
#     kubernetes-validate (PyPI; its schemas ship inside the package, so this
#     works offline), strict (an unknown or misspelt field fails), for the
#     oldest and newest Kubernetes we claim (KUBE_VERSIONS). Where the tool
#     is missing the step says so and is skipped, unless
#     MONARCH_REQUIRE_KUBE_VALIDATE=1 (CI sets it where it installed it).
#  2. structure (always, PyYAML): the fields Monarch relies on and how the
#     pieces refer to each other: Service <-> StatefulSet <-> hostfile,
#     token Secret <-> MONARCH_TOKEN_FILE, probes, requests, non-root.
# Finds the validator as $MONARCH_KUBE_VALIDATE or on PATH. Exit 0: valid.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-deploy/k8s}
KUBE_VERSIONS=${KUBE_VERSIONS:-"1.27.0 1.37.0"} # oldest and newest we validate against

manifests=()
for f in "$DIR"/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
[ ${#manifests[@]} -gt 0 ] || { echo "k8s_validate: no manifests in $DIR" >&2; exit 1; }

# ---- 1. schema ----------------------------------------------------------------------
kv=${MONARCH_KUBE_VALIDATE:-$(command -v kubernetes-validate || true)}
if [ -n "$kv" ] && [ -x "$kv" ]; then
  for v in $KUBE_VERSIONS; do
    "$kv" --strict --no-warn --quiet -k "$v" "${manifests[@]}" ||
      { echo "k8s_validate: schema check failed for Kubernetes $v" >&2; exit 1; }
  done
  echo "k8s_validate: schemas ok (kubernetes-validate --strict, Kubernetes $KUBE_VERSIONS)"
elif [ "${MONARCH_REQUIRE_KUBE_VALIDATE:-0}" = 1 ]; then
  echo "k8s_validate: kubernetes-validate is required but not found" >&2
  exit 1
else
  echo "k8s_validate: kubernetes-validate not installed (pip install kubernetes-validate): schema check skipped"
fi

# ---- 2. structure -------------------------------------------------------------------
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import yaml' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "k8s_validate: needs Python 3 with PyYAML (apt-get install python3-yaml)" >&2; exit 1; }

"$py" - "$DIR" <<'PY'
import os, re, sys, yaml

d = sys.argv[1]
errors = []
def err(where, msg): errors.append(f"{where}: {msg}")

kust = yaml.safe_load(open(os.path.join(d, "kustomization.yaml")))
docs = {}
for f in kust.get("resources", []):
    path = os.path.join(d, f)
    if not os.path.exists(path):
        err("kustomization.yaml", f"lists {f}, which does not exist"); continue
    for doc in yaml.safe_load_all(open(path)):
        if not doc: continue
        for k in ("apiVersion", "kind", "metadata"):
            if k not in doc: err(f, f"has no {k}")
        docs[(doc.get("kind"), doc.get("metadata", {}).get("name"))] = (f, doc)
listed = set(kust.get("resources", []))
for f in sorted(os.listdir(d)):
    if f.endswith(".yaml") and f != "kustomization.yaml" and f not in listed:
        err("kustomization.yaml", f"does not list {f}")

def one(kind):
    found = [(k, v) for k, v in docs.items() if k[0] == kind]
    if len(found) != 1:
        err("deploy/k8s", f"wants exactly one {kind}, found {len(found)}"); return None, {}
    return found[0][1]

def get(obj, path, where):
    cur = obj
    for p in path.split("."):
        if isinstance(cur, list):
            cur = cur[int(p)] if p.isdigit() and int(p) < len(cur) else None
        elif isinstance(cur, dict):
            cur = cur.get(p)
        else:
            cur = None
        if cur is None:
            err(where, f"missing {path}"); return None
    return cur

secret_names = {g["name"] for g in kust.get("secretGenerator", [])}
for (kind, name), (f, doc) in docs.items():
    if kind == "Secret": secret_names.add(name)

def check_pod(f, spec, role):
    """The pod rules both the agents and the controller follow."""
    where = f"{f} ({role} pod)"
    sc = spec.get("securityContext", {})
    if sc.get("runAsNonRoot") is not True: err(where, "securityContext.runAsNonRoot must be true")
    if not isinstance(sc.get("runAsUser"), int) or sc["runAsUser"] == 0: err(where, "securityContext.runAsUser must be a non-zero uid")
    cs = spec.get("containers") or []
    if len(cs) != 1: err(where, "wants exactly one container"); return None
    c = cs[0]
    for r in ("cpu", "memory"):
        if r not in (c.get("resources", {}).get("requests") or {}): err(where, f"resources.requests.{r} is missing")
    csc = c.get("securityContext", {})
    if csc.get("allowPrivilegeEscalation") is not False: err(where, "container allowPrivilegeEscalation must be false")
    if "ALL" not in (csc.get("capabilities", {}).get("drop") or []): err(where, "container must drop ALL capabilities")
    # The token: MONARCH_TOKEN_FILE points into a read-only mount of the token Secret.
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    if any(e.get("name") == "MONARCH_TOKEN" for e in c.get("env", [])):
        err(where, "sets MONARCH_TOKEN in the pod spec; mount the Secret and set MONARCH_TOKEN_FILE")
    tf = env.get("MONARCH_TOKEN_FILE")
    if not tf: err(where, "MONARCH_TOKEN_FILE is not set"); return c
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    ok = False
    for m in c.get("volumeMounts", []):
        v = vols.get(m["name"], {})
        if tf.startswith(m["mountPath"].rstrip("/") + "/") and "secret" in v:
            ok = True
            if v["secret"].get("secretName") not in secret_names:
                err(where, f"mounts Secret {v['secret'].get('secretName')!r}, which nothing defines")
            if not m.get("readOnly"): err(where, f"mounts the token at {m['mountPath']} writable")
            key = tf[len(m["mountPath"].rstrip("/")) + 1:]
            gens = {g["name"]: g for g in kust.get("secretGenerator", [])}
            g = gens.get(v["secret"].get("secretName"))
            if g and key not in [x.split("=")[0] for x in g.get("files", [])]:
                err(where, f"reads key {key!r}, which the Secret generator does not make")
    if not ok: err(where, f"MONARCH_TOKEN_FILE={tf} is not inside a mounted Secret")
    return c

# Agents: StatefulSet behind a headless Service.
sf, sts = one("StatefulSet")
vf, svc = one("Service")
port = None
if sts and svc:
    if get(svc, "spec.clusterIP", vf) != "None": err(vf, "the agents' Service must be headless (clusterIP: None)")
    if sts.get("spec", {}).get("serviceName") != svc["metadata"]["name"]:
        err(sf, f"serviceName {sts['spec'].get('serviceName')!r} is not the Service {svc['metadata']['name']!r}")
    sel = get(sts, "spec.selector.matchLabels", sf) or {}
    labels = get(sts, "spec.template.metadata.labels", sf) or {}
    for k, v in sel.items():
        if labels.get(k) != v: err(sf, f"selector {k}={v} does not match the pod labels")
    for k, v in (svc["spec"].get("selector") or {}).items():
        if labels.get(k) != v: err(vf, f"selector {k}={v} does not match the agent pods")
    c = check_pod(sf, sts["spec"]["template"]["spec"], "agent")
    if c:
        cmd = c.get("command", []) + c.get("args", [])
        if not cmd or not cmd[0].endswith("monarch-worker"): err(sf, "the agent container must run monarch-worker")
        if "--listen" not in cmd: err(sf, "monarch-worker needs --listen")
        else:
            listen = cmd[cmd.index("--listen") + 1]
            m = re.fullmatch(r"0\.0\.0\.0:(\d+)", listen)
            if not m: err(sf, f"--listen {listen}: agents in a pod listen on 0.0.0.0:PORT")
            else: port = int(m.group(1))
        if "--once" in cmd: err(sf, "a long-running agent must not use --once")
        cports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        if port is not None and port not in cports.values(): err(sf, f"containerPort {port} is not declared")
        for probe in ("readinessProbe",):
            tcp = (c.get(probe) or {}).get("tcpSocket")
            if not tcp: err(sf, f"{probe} must be a tcpSocket probe")
            elif cports.get(tcp["port"], tcp["port"]) != port: err(sf, f"{probe} does not probe the agent port")
        sp = svc["spec"].get("ports") or [{}]
        tp = sp[0].get("targetPort", sp[0].get("port"))
        if cports.get(tp, tp) != port or sp[0].get("port") != port:
            err(vf, f"port {sp[0].get('port')} -> {tp} is not the agent port {port}")

# Controller: a Job with the agents' addresses.
jf, job = one("Job")
if job:
    pod = job["spec"]["template"]["spec"]
    if pod.get("restartPolicy") not in ("Never", "OnFailure"): err(jf, "a Job's pods need restartPolicy Never or OnFailure")
    c = check_pod(jf, pod, "controller")
    if c:
        cmd = c.get("command", []) + c.get("args", [])
        if not cmd or not cmd[0].endswith("monarch-run"): err(jf, "the controller container must run monarch-run")
        hosts = []
        if "--hosts" in cmd:
            hosts = cmd[cmd.index("--hosts") + 1].split(",")
        elif "--hostfile" in cmd:
            hf = cmd[cmd.index("--hostfile") + 1]
            vols = {v["name"]: v for v in pod.get("volumes", [])}
            for m in c.get("volumeMounts", []):
                if hf.startswith(m["mountPath"].rstrip("/") + "/"):
                    cm = vols.get(m["name"], {}).get("configMap", {}).get("name")
                    key = hf[len(m["mountPath"].rstrip("/")) + 1:]
                    entry = docs.get(("ConfigMap", cm))
                    if not entry: err(jf, f"--hostfile {hf} is in ConfigMap {cm!r}, which nothing defines")
                    elif key not in entry[1].get("data", {}): err(entry[0], f"has no key {key!r} for --hostfile")
                    else:
                        hosts = [l.strip() for l in entry[1]["data"][key].splitlines()
                                 if l.strip() and not l.strip().startswith("#")]
                        script = cmd[-1]
                        if script.startswith(m["mountPath"].rstrip("/") + "/"):
                            if script[len(m["mountPath"].rstrip("/")) + 1:] not in entry[1]["data"]:
                                err(entry[0], f"has no key for the script {script}")
            if not hosts: err(jf, f"--hostfile {hf} is not a mounted ConfigMap key with hosts")
        else:
            err(jf, "monarch-run needs --hosts or --hostfile")
        if sts and svc and port is not None:
            want = [f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}:{port}"
                    for i in range(sts["spec"].get("replicas", 1))]
            if hosts != want:
                err(jf, f"the controller's hosts {hosts} are not the StatefulSet's pods {want}")

# NetworkPolicy: lets the controller's pods reach the agents'.
for (kind, name), (f, doc) in docs.items():
    if kind != "NetworkPolicy": continue
    for rule in doc["spec"].get("ingress", []):
        for peer in rule.get("from", []):
            want = (peer.get("podSelector") or {}).get("matchLabels") or {}
            for role, wf, obj in (("controller", jf, job), ("agent", sf, sts)):
                if not obj: continue
                labels = obj["spec"]["template"]["metadata"].get("labels", {})
                if any(labels.get(k) != v for k, v in want.items()):
                    err(f, f"admits pods labelled {want}, which the {role} pods ({wf}) are not")

if errors:
    for e in errors: print("k8s_validate:", e, file=sys.stderr)
    sys.exit(1)
print(f"k8s_validate: structure ok ({len(docs)} resources)")
PY
