#!/usr/bin/env python3
"""Loads every panel's query of the Grafana dashboard from a Prometheus,
as Grafana would: the check of the dashboard where Grafana itself cannot
run (no image for it here), and a quick one against your own Prometheus.

  python3 scripts/dashboard-check.py http://127.0.0.1:9090 [dashboard.json]

Every query must be valid PromQL that Prometheus evaluates (status
success); every panel must show something: at least one of its queries
returns a series. Exits 1 naming each query or panel that fails.
"""
import json
import sys
import urllib.parse
import urllib.request

prom = sys.argv[1].rstrip("/")
path = sys.argv[2] if len(sys.argv) > 2 else "infra/grafana/dashboards/tailer.json"
dashboard = json.load(open(path))


def panels(ps):
    for p in ps:
        yield p
        yield from panels(p.get("panels") or [])


bad, queries, shown = [], 0, 0
for p in panels(dashboard["panels"]):
    targets = [t["expr"] for t in p.get("targets") or [] if t.get("expr")]
    if not targets:
        continue
    series = 0
    for expr in targets:
        queries += 1
        url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                answer = json.load(r)
        except Exception as e:  # an HTTP 400 is a query Prometheus rejects
            bad.append(f"panel {p['id']} ({p.get('title')}): {expr}: {e}")
            continue
        if answer.get("status") != "success":
            bad.append(f"panel {p['id']} ({p.get('title')}): {expr}: {answer}")
            continue
        series += len(answer["data"]["result"])
    if series == 0:
        bad.append(f"panel {p['id']} ({p.get('title')}): no query returns a series")
    else:
        shown += 1
if bad:
    print("dashboard check FAILED:\n  " + "\n  ".join(bad))
    sys.exit(1)
print(f"dashboard check: {queries} queries evaluated, {shown} panels show data")
