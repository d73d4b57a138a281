-- One wrk script for every row of the benchmark, so the load generator does the same work per
-- request in every row (a request() call and a response() call), and differences between rows
-- are the servers' own.
--
-- Arguments after `--`, each key=value:
--   method=GET|POST  path=/...  body=<form body or empty>  token=<agent token or empty>
--   op=<fixed X-Operation-Id>             (optional: the rejection row)
--   base=<first id> per=<ids per thread>  (optional: every request a distinct operation id;
--                                           thread i sends base + i*per .. base + (i+1)*per - 1)
-- At the end it prints ONE line of JSON (prefixed BENCH_JSON) with counts per status and
-- latency percentiles in microseconds; bench/run.py parses it.

local threads = {}
local thread_count = 0

function setup(thread)
  thread:set("thread_index", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

local opts = {}
local fixed_request = nil
-- Globals, so that done() can read them from each thread with thread:get().
next_offset = 0
statuses = {}

function init(args)
  for _, arg in ipairs(args) do
    local key, value = string.match(arg, "^([^=]+)=(.*)$")
    if key then opts[key] = value end
  end
  headers = {}
  if opts.body ~= nil and opts.body ~= "" then
    headers["Content-Type"] = "application/x-www-form-urlencoded"
  else
    opts.body = nil
  end
  if opts.token ~= nil and opts.token ~= "" then
    headers["Authorization"] = "Bearer " .. opts.token
  end
  if opts.op ~= nil and opts.op ~= "" then
    headers["X-Operation-Id"] = opts.op
  end
  if opts.base == nil then
    fixed_request = wrk.format(opts.method, opts.path, headers, opts.body)
  else
    first_id = tonumber(opts.base) + thread_index * tonumber(opts.per)
    per_thread = tonumber(opts.per)
  end
end

function request()
  if fixed_request ~= nil then
    return fixed_request
  end
  local id
  if next_offset < per_thread then
    id = string.format("%d", first_id + next_offset)
  else
    -- Out of pre-approved operations: send an id that does not exist, so the run is reported
    -- invalid (404) instead of silently re-using an operation.
    id = "exhausted"
  end
  next_offset = next_offset + 1
  headers["X-Operation-Id"] = id
  return wrk.format(opts.method, opts.path, headers, opts.body)
end

function response(status, response_headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local merged = {}
  local sent_ids = 0
  for _, thread in ipairs(threads) do
    local counts = thread:get("statuses")
    for status, count in pairs(counts) do
      merged[status] = (merged[status] or 0) + count
    end
    sent_ids = sent_ids + (thread:get("next_offset") or 0)
  end
  local parts = {}
  for status, count in pairs(merged) do
    table.insert(parts, string.format('"%d":%d', status, count))
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"sent_ids":%d,' ..
    '"socket_errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d},"status_errors":%d,' ..
    '"statuses":{%s},"latency_us":{"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes, sent_ids,
    e.connect, e.read, e.write, e.timeout, e.status,
    table.concat(parts, ","),
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max))
end
