"""Concurrency bands, request by request: tokenmeter's against the client's own timeline.

tokenmeter puts every request's decode speed in a band: the time-weighted mean number of
requests in flight at the proxy between that request's first and last token. The client can
compute the same mean from its own request timeline (start to end of every request it sent).
tokenmeter writes one debug line per decoded request (its TTFT, decode window, mean and band,
and its last token's wall-clock time; never content). This module reads those lines (both
processes run on this machine, on one clock), pairs each with the client's record of the same
request, and compares them.

A client can only be compared where it was keeping up. When GuideLLM's event loop stalls on
these 2 shared cores, it reads a whole stream in one burst, late: until then it counts that
request as in flight although the server has finished it, and it sends no new request, so the
server really does run fewer. Its timeline is wrong there and tokenmeter's is right. A stall
shows in the client's own records and in the pairs: the client saw a request's first or last
token well after tokenmeter passed it on, started its clock well before tokenmeter had the
request, or finished with a response well after its last token. Pairs whose decode window
overlaps any such lag are set aside and counted; all others must agree.

Standard library only: this runs in the clients' virtualenv next to GuideLLM.
"""

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FIELD = re.compile(r'(\w+)=("[^"]*"|\S+)')

# The client read a token this much later than tokenmeter passed it on: it was not keeping up.
LAG_S = 0.025
# Clock readings on either side are taken a little after the event they stand for.
CLOCK_S = 0.01
# Two observers of the same request may pair up only this far apart (first and last token
# times): a stalled client has read whole streams over a second late.
PAIR_S = 2.0


def decoded(log_path, t_from, t_to):
    """The `request decoded` lines of tokenmeter's log whose window ended in [t_from, t_to]
    (Unix seconds): [{"first", "last", "mean", "band", "output", "ttft", "queue", "model_load",
    "prefill", "generation"}], by first token; an engine part the stream did not state is None."""
    out = []
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            if "request decoded" not in raw:
                continue
            line = _ANSI.sub("", raw).strip()
            _, _, rest = line.partition(" ")
            try:
                fields = {k: v.strip('"') for k, v in _FIELD.findall(rest)}
                last = float(fields["last_token_unix_ms"]) / 1e3
                first = last - float(fields["decode_ms"]) / 1e3
                mean = float(fields["mean_in_flight"])
                band = fields["band"]
                output = int(fields["output"])
                ttft = float(fields["ttft_ms"]) / 1e3
                # The engine's stated parts, where its stream stated them (else None).
                stated = {k: float(fields[f"{k}_ms"]) / 1e3 if f"{k}_ms" in fields else None
                          for k in ("queue", "model_load", "prefill", "generation")}
            except (KeyError, ValueError):
                continue
            if t_from <= last <= t_to:
                out.append({"first": first, "last": last, "mean": mean, "band": band,
                            "output": output, "ttft": ttft, **stated})
    return sorted(out, key=lambda w: w["first"])


def client_mean(requests, first, last):
    """The client's time-weighted mean number of its requests in flight over [first, last]."""
    spans = [(r["start"], r["end"]) for r in requests if r["start"] and r["end"]]
    if last <= first:
        return float(sum(1 for s, e in spans if s <= first < e))
    area = sum(max(0.0, min(e, last) - max(s, first)) for s, e in spans)
    return area / (last - first)


def pair(windows, requests):
    """Pairs each of tokenmeter's decode windows with the client's record of the same request:
    the client saw its first and its last token at or after tokenmeter passed them on (up to
    CLOCK_S aside), within PAIR_S. Requests of a wave share their first
    token's engine step, so the pairs are chosen on both ends, closest first.
    Returns [(window, request or None)] in the order of `windows`."""
    # Cut requests included: GuideLLM reports no token count for them, tokenmeter decodes them.
    candidates = [r for r in requests if r.get("first") and r.get("last")]
    options = []
    for i, w in enumerate(windows):
        for j, r in enumerate(candidates):
            d1, d2 = r["first"] - w["first"], r["last"] - w["last"]
            if -CLOCK_S <= d1 <= PAIR_S and -CLOCK_S <= d2 <= PAIR_S:
                options.append((abs(d1) + abs(d2), i, j))
    chosen, used = {}, set()
    for _, i, j in sorted(options):
        if i not in chosen and j not in used:
            chosen[i] = candidates[j]
            used.add(j)
    return [(w, chosen.get(i)) for i, w in enumerate(windows)]


def compare(windows, requests, slack):
    """Pairs, finds where the client lagged, and compares the means of the rest.
    Returns {"pairs", "unpaired", "lagging", "burst", "compared", "off": [(window, mean)]}."""
    pairs = pair(windows, requests)
    lags = []
    for w, r in pairs:
        if r is None:
            continue
        if r["first"] - w["first"] > LAG_S:
            lags.append((w["first"], r["first"]))
        if r["last"] - w["last"] > LAG_S:
            lags.append((w["last"], r["last"]))
        arrived = w["first"] - w["ttft"]
        if arrived - r["start"] > LAG_S:
            lags.append((r["start"], arrived))
    # tokenmeter counts a request until `[DONE]` passes, right after its last token; the client
    # until it has finished with the response, which on a stalled event loop is much later.
    for r in requests:
        if r.get("last") and r.get("end") and r["end"] - r["last"] > LAG_S:
            lags.append((r["last"], r["end"]))
    result = {"pairs": 0, "unpaired": 0, "lagging": 0, "burst": 0, "compared": 0, "off": []}
    for w, r in pairs:
        if r is None:
            result["unpaired"] += 1
            continue
        result["pairs"] += 1
        # Everything the client knew about the decode window: its own view of it included.
        lo, hi = w["first"], max(w["last"], r["last"])
        if any(a < hi and b > lo for a, b in lags):
            result["lagging"] += 1
            continue
        # A response that came in one burst has a window of a millisecond or two: its mean is
        # the count at one instant, which two observers a few ms apart see differently.
        if w["last"] - w["first"] < 2 * LAG_S:
            result["burst"] += 1
            continue
        result["compared"] += 1
        m = client_mean(requests, w["first"], w["last"])
        if abs(m - w["mean"]) > slack:
            result["off"].append((w, m))
    return result


def ttft_differences(windows, requests):
    """For every paired request: the client's TTFT minus tokenmeter's, and its two parts, how
    long after the client started its clock tokenmeter had the request, and how long after
    tokenmeter passed the first token on the client read it. Returns [(total, send, read)]."""
    out = []
    for w, r in pair(windows, requests):
        if r is None or r.get("ttft_s") is None:
            continue
        arrived = w["first"] - w["ttft"]
        out.append((r["ttft_s"] - w["ttft"], arrived - r["start"], r["first"] - w["first"]))
    return out
