"""Prometheus text exposition: parse a scrape, subtract two scrapes, read histograms.

The real-server check compares counters and histograms over one phase of load, so everything
here works on the difference of two snapshots taken before and after the phase. Quantiles
are estimated exactly as Prometheus' `histogram_quantile` does (linear interpolation inside
the bucket), so a figure here is the figure a dashboard would show for the same data.

Standard library only: this runs in the clients' virtualenv next to GuideLLM.
"""

import math
import re
import urllib.request

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def fetch(url, timeout=10):
    """GETs a /metrics page as text."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def scrape(url, timeout=10):
    """GETs a /metrics page and parses it."""
    return parse(fetch(url, timeout))


def parse(text):
    """Returns {(name, frozenset(labels.items())): value} for every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, _, labels, value = m.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        out[(name, frozenset(_LABEL.findall(labels or "")))] = v
    return out


def _matches(labels, want):
    d = dict(labels)
    return all(d.get(k) == v for k, v in want.items())


class Delta:
    """What changed between two snapshots of the same server (after minus before)."""

    def __init__(self, before, after):
        self.before = before
        self.after = after

    def value(self, name, **labels):
        """The change of a counter: the sum over every series of `name` that has `labels`."""
        total = 0.0
        for (n, ls), v in self.after.items():
            if n == name and _matches(ls, labels):
                total += v - self.before.get((n, ls), 0.0)
        return total

    def by_label(self, name, label, **labels):
        """The change of a counter split by the values of one label."""
        out = {}
        for (n, ls), v in self.after.items():
            if n == name and _matches(ls, labels):
                key = dict(ls).get(label)
                out[key] = out.get(key, 0.0) + v - self.before.get((n, ls), 0.0)
        return {k: v for k, v in out.items() if v}

    def histogram(self, name, **labels):
        """The change of a histogram `name` (without `_bucket`), summed over matching series."""
        return Histogram.from_samples(self.after, name, labels).minus(
            Histogram.from_samples(self.before, name, labels)
        )


def gauge(snapshot, name, **labels):
    """The current value of a gauge: the sum over every series of `name` that has `labels`."""
    return sum(v for (n, ls), v in snapshot.items() if n == name and _matches(ls, labels))


def sample(snapshot, name, **labels):
    """The value of one series of a gauge, or None when it is absent (a gauge that is not
    exported yet must not read as 0)."""
    for (n, ls), v in snapshot.items():
        if n == name and _matches(ls, labels):
            return v
    return None


class Histogram:
    """Cumulative bucket counts by upper bound, plus sum and count."""

    def __init__(self, cumulative, total_sum=0.0):
        # [(upper bound, cumulative count)], sorted, ending with +Inf.
        self.cumulative = cumulative
        self.sum = total_sum

    @classmethod
    def from_samples(cls, snapshot, name, labels):
        buckets = {}
        total_sum = 0.0
        for (n, ls), v in snapshot.items():
            if not _matches(ls, labels):
                continue
            if n == name + "_bucket":
                le = float(dict(ls)["le"])
                buckets[le] = buckets.get(le, 0.0) + v
            elif n == name + "_sum":
                total_sum += v
        return cls(sorted(buckets.items()), total_sum)

    @classmethod
    def from_values(cls, values, bounds):
        """Bins raw observations into the given upper bounds (+Inf is added), as a client
        library would have, so client-side figures go through the same estimator."""
        bounds = sorted(set(bounds) | {math.inf})
        values = sorted(values)
        cumulative, i = [], 0
        for b in bounds:
            while i < len(values) and values[i] <= b:
                i += 1
            cumulative.append((b, float(i)))
        return cls(cumulative, float(sum(values)))

    def minus(self, other):
        before = dict(other.cumulative)
        return Histogram(
            [(le, c - before.get(le, 0.0)) for le, c in self.cumulative],
            self.sum - other.sum,
        )

    @property
    def count(self):
        return self.cumulative[-1][1] if self.cumulative else 0.0

    def bounds(self):
        return [le for le, _ in self.cumulative if not math.isinf(le)]

    def quantile(self, q):
        """Prometheus' histogram_quantile: None when empty."""
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.cumulative:
            if c >= rank and c > prev_c:
                if math.isinf(le):
                    return prev_le
                return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = le, c
        return prev_le

    def counts_by_bucket(self):
        """Non-cumulative counts: [(upper bound, count)]."""
        out, prev = [], 0.0
        for le, c in self.cumulative:
            out.append((le, c - prev))
            prev = c
        return out

    def dominated_by(self, other):
        """True when, at every bound, this histogram has no more observations at or below it
        than `other`: every value of `other` is matched by one of ours at least as large
        (first-order stochastic dominance), which is what "measured later" means for two
        histograms of the same requests. Needs equal counts and identical bounds."""
        mine, theirs = dict(self.cumulative), dict(other.cumulative)
        return all(mine[le] <= theirs.get(le, math.inf) for le in mine)
