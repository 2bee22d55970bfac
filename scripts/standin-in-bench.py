"""How the stand-in answers `{sensor: {$in: [...]}, metric, start: range}` as
the list grows, against per-sensor equality finds (docs/src/operating/storage-server.md, "known
divergences"). Usage, with a server from `scripts/stack.sh`:

    .venv/bin/python scripts/standin-in-bench.py <port>

Loads 200 000 bucket-shaped documents into database `bench` (dropped first).
"""
import time, datetime, sys
import pymongo
port = int(sys.argv[1])
c = pymongo.MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true")
col = c.bench.buckets
col.drop()
col.create_index([("sensor",1),("metric",1),("start",1)], unique=True)
base = datetime.datetime(2026,10,1,tzinfo=datetime.timezone.utc)
docs = []
t=time.time()
for s in range(100):
    for m in range(2000):
        docs.append({"sensor": f"lt-{s:05}", "metric": "m0", "start": base + datetime.timedelta(minutes=m), "v": {"0": 1.0}, "count": 1})
    if len(docs) >= 20000:
        col.insert_many(docs); docs=[]
if docs: col.insert_many(docs)
print("loaded", col.estimated_document_count(), round(time.time()-t,1))
sensors = [f"lt-{s:05}" for s in range(100)]
for k in (1, 10):
    t = time.time()
    lo_k = base + datetime.timedelta(minutes=1970)
    n = len(list(col.find({"sensor": {"$in": sensors[:k]}, "metric": "m0",
                           "start": {"$gte": lo_k, "$lt": lo_k + datetime.timedelta(minutes=30)}})))
    print(f"in{k}", n, round(time.time()-t, 3), "s")
lo = base + datetime.timedelta(minutes=1970); hi = base + datetime.timedelta(minutes=2000)
for name, f in [
    ("in", {"sensor": {"$in": sensors}, "metric": "m0", "start": {"$gte": lo, "$lt": hi}}),
    ("range", {"sensor": {"$gte": sensors[0], "$lte": sensors[-1]}, "metric": "m0", "start": {"$gte": lo, "$lt": hi}}),
    ("or", {"$or": [{"sensor": s, "metric": "m0", "start": {"$gte": lo, "$lt": hi}} for s in sensors]}),
]:
    t = time.time()
    n = len(list(col.find(f)))
    print(name, n, round(time.time()-t, 3), "s")
t = time.time(); n=0
for s in sensors:
    n += len(list(col.find({"sensor": s, "metric": "m0", "start": {"$gte": lo, "$lt": hi}})))
print("per-sensor eq", n, round(time.time()-t,3), "s")
