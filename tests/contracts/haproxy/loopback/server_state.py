"""Item 1 on real HAProxy: a reload (and a stop/start) with ports moved while servers are drained / in maintenance."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

D = "/tmp/rfix-exp"
HELPER = sys.argv[1]
BINS = {"2.6.12-1+deb12u4": "/tmp/rfix-haproxy-2.6/haproxy", "3.0.11-1+deb13u4": "/tmp/rfix-haproxy-3.0/haproxy"}

def cfg(ports):
    servers = "".join(f"    server s{i} 127.0.0.1:{p} maxconn 4\n" for i, p in enumerate(ports, 1))
    return f"""global
    stats socket {D}/admin.sock mode 660 level admin expose-fd listeners
    server-state-file {D}/server-state
defaults
    mode http
    load-server-state-from-file global
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend fe
    bind 127.0.0.1:31080
    default_backend be_a
backend be_a
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
    default-server check inter 500 fall 2 rise 2 init-addr libc,none slowstart 10s
{servers}"""

def ask(cmd, path=f"{D}/admin.sock"):
    s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(path); s.sendall(cmd.encode() + b"\n"); s.shutdown(socket.SHUT_WR)
    out = b""
    while c := s.recv(65536): out += c
    s.close(); return out.decode()

def stat():
    rows = [l.split(",") for l in ask("show stat").splitlines() if l.startswith("be_a,s")]
    return {r[1]: f"{r[17]} {r[73]}" for r in rows}

def reached(n=8):
    out = {}
    for _ in range(n):
        try:
            body = urllib.request.urlopen("http://127.0.0.1:31080/", timeout=3).read().decode().split()[1]
        except Exception as exc:
            body = f"error {type(exc).__name__}"
        out[body] = out.get(body, 0) + 1
    return out

def start(binary):
    subprocess.run([binary, "-W", "-S", f"{D}/master.sock", "-f", f"{D}/h.cfg", "-p", f"{D}/h.pid", "-D"], check=True, stderr=subprocess.DEVNULL)
    time.sleep(1.5)

def pid(): return int(open(f"{D}/h.pid").read())

def save(config=True):
    args = [sys.executable, HELPER, f"{D}/admin.sock", f"{D}/server-state"] + ([f"{D}/h.cfg"] if config else [])
    return subprocess.run(args, capture_output=True, text=True).stderr.splitlines()

BEFORE, AFTER = [31001, 31002, 31003, 31004], [31001, 31005, 31006, 31004]
def scenario(binary, how):
    for f in ("server-state", "admin.sock", "master.sock"):
        if os.path.exists(f"{D}/{f}"): os.remove(f"{D}/{f}")
    open(f"{D}/h.cfg", "w").write(cfg(BEFORE)); start(binary)
    ask("set server be_a/s1 state drain"); ask("set server be_a/s3 state drain"); ask("set server be_a/s4 state maint")
    rec = {"before": stat()}
    open(f"{D}/h.cfg", "w").write(cfg(AFTER))
    if how == "reload, plain save (before the fix)":
        ask("show servers state")  # as the old shell helper: the answer unchanged
        open(f"{D}/server-state", "w").write(ask("show servers state")); notes = []
        os.kill(pid(), signal.SIGUSR2)
    elif how == "reload, the helper with the configuration":
        notes = save(); os.kill(pid(), signal.SIGUSR2)
    else:  # stop (the helper saves, config already new), start after --reconcile
        notes = save(); os.kill(pid(), signal.SIGTERM); time.sleep(1)
        notes += subprocess.run([sys.executable, HELPER, "--reconcile", f"{D}/server-state", f"{D}/h.cfg"], capture_output=True, text=True).stderr.splitlines()
        start(binary)
    time.sleep(0.3)
    rec["helper"] = [n.split(": ", 1)[1] for n in notes]
    rec["state_file"] = open(f"{D}/server-state").read().splitlines()[2:]
    rec["just_after"] = stat()
    time.sleep(2.5)
    rec["after_checks"] = stat(); rec["requests_reached_port"] = reached()
    procs = ask("show proc", f"{D}/master.sock")
    rec["workers"] = sum(1 for l in procs.splitlines() if " worker " in f" {l} ")
    os.kill(pid(), signal.SIGTERM); time.sleep(0.8)
    return rec

out = {}
for version, binary in BINS.items():
    out[version] = {how: scenario(binary, how) for how in ("reload, plain save (before the fix)", "reload, the helper with the configuration", "stop, configuration changed, start (ExecStartPre --reconcile)")}
    out[version]["show_servers_state_header"] = None
json.dump(out, open(f"{D}/state-results.json", "w"), indent=1)
print(json.dumps(out, indent=1))
