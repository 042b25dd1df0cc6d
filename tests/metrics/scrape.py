"""Scraping an exporter over HTTP and reading the samples back with prometheus-client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as resp:
        assert resp.status == 200
        return resp.read().decode()


class Samples:
    """Samples of one scrape: `s.get(name, **labels)` sums the samples whose labels include those
    given (None when there is none); `s.names` are the sample names, `s.families` the family names."""

    def __init__(self, text: str):
        self.rows: list[tuple[str, dict, float]] = []
        self.families: set[str] = set()
        for fam in text_string_to_metric_families(text):
            self.families.add(fam.name)
            for smp in fam.samples:
                self.rows.append((smp.name, dict(smp.labels), float(smp.value)))
        self.names = {r[0] for r in self.rows}

    def all(self, name: str, **labels) -> list[tuple[dict, float]]:
        return [(lab, v) for n, lab, v in self.rows
                if n == name and all(lab.get(k) == str(w) for k, w in labels.items())]

    def get(self, name: str, **labels) -> float | None:
        found = self.all(name, **labels)
        return sum(v for _, v in found) if found else None
