-- wrk script for the soak test: streaming chat completions, and one machine-readable summary line.
wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"soak-model","messages":[{"role":"user","content":"hi"}],'
  .. '"stream":true,"stream_options":{"include_usage":true}}'

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK requests=%d bytes=%d non2xx=%d connect=%d read=%d write=%d timeout=%d duration_us=%d p50_ms=%.1f p99_ms=%.1f\n",
    summary.requests, summary.bytes, e.status, e.connect, e.read, e.write, e.timeout,
    summary.duration, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
