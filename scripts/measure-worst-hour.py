#!/usr/bin/env python3
"""The worst-case hour request (833 sensors x one reading in each of 60 minutes,
hour buckets) against two hourglass release binaries on one local SecantusDB:
service CPU, wall time and write commands for each. Usage (after make test set
up .venv): python3 scripts/measure-worst-hour.py OLD_BINARY NEW_BINARY
"""
import json, os, subprocess, time, socket, urllib.request, sys
def free():
    s=socket.socket(); s.bind(("127.0.0.1",0)); p=s.getsockname()[1]; s.close(); return p
def cpu(pid):
    f=open(f"/proc/{pid}/stat").read().rsplit(")",1)[1].split()
    return (int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK")
t=int(time.time())-2*86400; t-=t%3600
body=json.dumps([{"sensor":f"w{s:03}","metric":"m","ts":(t+m*60+7)*1000,"value":1.0} for s in range(833) for m in range(60)]).encode()
dbp=free()
db=subprocess.Popen([os.path.join(os.path.dirname(__file__),"..",".venv","bin","secantusd-py"),"--host","127.0.0.1","--port",str(dbp),"--storage-path",":memory:","--log-level","ERROR"],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
time.sleep(4)
for name,binp,extra in [("before",sys.argv[1],{}),("after",sys.argv[2],{"HOURGLASS__HTTP__REQUEST_TIMEOUT":"601s"})]:
  for run in range(2):
    hp=free()
    env=dict(os.environ, HOURGLASS__MONGODB__URI=f"mongodb://127.0.0.1:{dbp}/?directConnection=true", HOURGLASS__MONGODB__DATABASE=f"meas_{name}_{run}",
             HOURGLASS__HTTP__LISTEN=f"127.0.0.1:{hp}", HOURGLASS__MQTT__ENABLED="false", HOURGLASS__BUCKETS__GRANULARITY="hour",
             HOURGLASS__BATCHER__MAX_PENDING_READINGS="50000", HOURGLASS__HTTP__WRITE_TIMEOUT="600s", HOURGLASS__LOG__LEVEL="warn", **extra)
    p=subprocess.Popen([binp,"--config","/dev/null"],env=env,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
    for _ in range(200):
        try: urllib.request.urlopen(f"http://127.0.0.1:{hp}/health/live"); break
        except Exception: time.sleep(0.1)
    c0=cpu(p.pid); w0=time.time()
    r=urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{hp}/api/v1/readings",data=body,headers={"content-type":"application/json"}),timeout=700)
    w1=time.time(); c1=cpu(p.pid)
    m=urllib.request.urlopen(f"http://127.0.0.1:{hp}/metrics").read().decode()
    rt=[l for l in m.splitlines() if l.startswith("hourglass_write_round_trips_total")]
    print(name, run, "status", r.status, "service CPU s %.3f"%(c1-c0), "wall s %.1f"%(w1-w0), rt, flush=True)
    p.terminate(); p.wait()
db.terminate()
