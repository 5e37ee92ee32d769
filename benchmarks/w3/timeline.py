"""w3probe.py: a Server idles in this process; a child process enqueues N jobs GAP ms apart;
print latency percentiles and, for the slowest jobs, what else happened around them."""
import asyncio, gc, os, sys, time, subprocess, json
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "psettings")
import django
django.setup()
from django.core.management import call_command
from django.db import connection
from later_django.worker import Server
from papp import jobs as pj

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
FREEZE = "freeze" in sys.argv
call_command("migrate", verbosity=0); call_command("later_migrate", verbosity=0)
with connection.cursor() as c: c.execute("TRUNCATE later_job")
connection.close()
marks = []  # (time, what)
def gc_cb(phase, info):
    if phase == "start": gc_cb.t = time.time()
    else: marks.append((gc_cb.t, time.time(), f"gc gen{info['generation']}"))
gc.callbacks.append(gc_cb)

PRODUCER = r'''
import os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "psettings")
import django; django.setup()
import later_django
from papp.jobs import Timed
N, gap = int(sys.argv[1]), 0.02
later_django.enqueue(Timed(-1, time.time()))
t0 = time.time() + 0.5
for i in range(N):
    while time.time() < t0 + i * gap: time.sleep(0.0005)
    t = time.time(); later_django.enqueue(Timed(i, t)); print(i, t, time.time(), flush=True)
'''

async def main():
    s = Server(workers=8)
    orig_call = s.maintenance._call
    def call(step, d, c):
        a = time.time()
        try: return orig_call(step, d, c)
        finally: marks.append((a, time.time(), f"maint {getattr(step, '__name__', step)}"))
    s.maintenance._call = call
    orig_store_run = s.store.run
    async def store_run(pool, fn, *a, **k):
        t = time.time()
        try: return await orig_store_run(pool, fn, *a, **k)
        finally: marks.append((t, time.time(), f"store {getattr(fn, '__name__', 'fn')}"))
    s.store.run = store_run
    wakes = []
    orig_wake = s.wake.wake
    def wake(count=None):
        wakes.append(time.time()); orig_wake(count)
    s.wake.wake = wake
    claims = []
    orig_claim = s.claimer.path.claim
    async def claim(**kw):
        a = time.time(); r = await orig_claim(**kw); claims.append((a, time.time(), len(r))); return r
    s.claimer.path.claim = claim
    batches = []
    orig_flush = s.claimer._claims._flush
    async def flush(reqs):
        batches.append(time.time()); return await orig_flush(reqs)
    s.claimer._claims._flush = flush
    resumed = []
    orig_wait = s.wake.wait
    async def wait(timeout, since=None):
        await orig_wait(timeout, since); resumed.append(time.time())
    s.wake.wait = wait
    execs = []
    import psycopg
    orig_exec = psycopg.AsyncCursor.execute
    async def ex(self, *a, **k):
        execs.append(time.time()); return await orig_exec(self, *a, **k)
    psycopg.AsyncCursor.execute = ex
    await s.start()
    if FREEZE: gc.freeze()
    await asyncio.sleep(1.0)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", PRODUCER, str(N), stdout=asyncio.subprocess.PIPE, env=os.environ)
    out, _ = await proc.communicate()
    while len(pj.STARTS) < N + 1: await asyncio.sleep(0.01)
    await s.shutdown(5)
    rows = [l.split() for l in out.decode().split("\n") if l]
    enq = {int(r[0]): float(r[1]) for r in rows}
    done = {int(r[0]): float(r[2]) for r in rows}
    import bisect
    wt = sorted(wakes); ct = sorted(claims)
    parts = []
    for i in enq:
        t0, t1, ts = enq[i], done[i], pj.STARTS[i]
        w = next((x for x in wt if x >= t0), None)
        c = next((c for c in ct if c[0] >= (w or t0) and c[2] > 0), None)
        parts.append((i, (t1-t0)*1e3, ((w or t1)-t1)*1e3, ((c[0] if c else ts)-(w or t1))*1e3, ((c[1]-c[0]) if c else 0)*1e3, (ts-(c[1] if c else ts))*1e3))
    def after(xs, t):
        return next((x for x in sorted(xs) if x >= t), None)
    d1=[];d2=[];d3=[]
    for w in wt:
        r = after(resumed, w); b = after(batches, w); e = after(execs, b) if b else None
        if r and b and e and b - w < 0.01:
            d1.append((r-w)*1e3); d2.append((b-r)*1e3); d3.append((e-b)*1e3)
    for name, v in (("wake->first resume", d1), ("resume->batch", d2), ("batch->execute", d3)):
        v.sort(); print(f"  {name:18s} p50 {v[len(v)//2]:.3f} p99 {v[int(.99*len(v))]:.3f}")
    import statistics
    for k, name in [(1,'enqueue call'),(2,'commit->wake'),(3,'wake->claim sent'),(4,'claim rtt'),(5,'claimed->start')]:
        v = sorted(p[k] for p in parts)
        print(f"  {name:18s} p50 {v[len(v)//2]:.2f} p99 {v[int(.99*len(v))]:.2f} max {v[-1]:.2f}")
    lat = sorted(((pj.STARTS[i] - enq[i]) * 1000, i) for i in enq)
    ms = [l for l, _ in lat]
    pick = lambda p: ms[min(len(ms) - 1, int(p * len(ms)))]
    print(f"p50 {pick(.5):.2f} p95 {pick(.95):.2f} p99 {pick(.99):.2f} max {ms[-1]:.2f} ms; gcs: {len(marks)}")
    for l, i in lat[-6:]:
        t0, t1 = enq[i], pj.STARTS[i]
        near = [(w, round((a - t0) * 1000, 1), round((b - a) * 1000, 1)) for a, b, w in marks if a < t1 and b > t0 - 0.005]
        print(f"  job {i}: {l:.2f} ms  overlapping: {near}")
asyncio.run(main())
