"""The Lua scripts RedisStore runs: each one state transition of a job, atomic on the queue's Redis."""

from __future__ import annotations

_RUNNING = ("(s == 'lowering' or s == 'building' or s == 'autotuning' or s == 'storing')")

# Note: submit is one script so that "a live job for this key?" and "queue a new job" happen
# atomically; two identical requests can never both create a job, on any number of API replicas.
# KEYS: inflight, job, stream, interactive stream, recent-jobs zset.
# ARGV: job id, job key prefix, inflight ttl ms, job ttl s, priority, stream max len,
#       recent max, created_at, then the job's fields.
SUBMIT = f"""
local existing = redis.call('GET', KEYS[1])
if existing then
  local job = ARGV[2] .. existing
  local s = redis.call('HGET', job, 'stage')
  if s == 'queued' and ARGV[5] == 'interactive' and redis.call('HGET', job, 'priority') == 'precompile' then
    -- A user now waits on a background job: queue it again where workers look first.
    local entry = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'job_id', existing)
    redis.call('HSET', job, 'priority', 'interactive', 'stream', KEYS[4], 'entry_id', entry)
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {{'promoted', existing}}
  end
  if s == 'queued' or {_RUNNING} then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {{'joined', existing}}
  end
end
if redis.call('XLEN', KEYS[3]) >= tonumber(ARGV[6]) then return {{'full', ''}} end
redis.call('HSET', KEYS[2], unpack(ARGV, 9))
local entry = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'job_id', ARGV[1])
redis.call('HSET', KEYS[2], 'stream', KEYS[3], 'entry_id', entry)
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('ZADD', KEYS[5], ARGV[8], ARGV[1])
local extra = redis.call('ZCARD', KEYS[5]) - tonumber(ARGV[7])
if extra > 0 then redis.call('ZREMRANGEBYRANK', KEYS[5], 0, extra - 1) end
return {{'created', ARGV[1]}}
"""

# Note: one tune job per artifact key in flight, as SUBMIT keeps one compile job per key. The tune
# job copies the compile request (the tuner re-derives the schedule from it); the stored artifact
# itself is read by the worker that takes the job.
# KEYS: tune inflight, job, tune stream, recent-jobs zset, tune archs set.
# ARGV: job id, job key prefix, inflight ttl ms, job ttl s, stream max len, recent max, created_at,
#       arch, then the job's fields.
SUBMIT_TUNE = f"""
local existing = redis.call('GET', KEYS[1])
if existing then
  local s = redis.call('HGET', ARGV[2] .. existing, 'stage')
  if s == 'queued' or {_RUNNING} then return {{'joined', existing}} end
end
if redis.call('XLEN', KEYS[3]) >= tonumber(ARGV[5]) then return {{'full', ''}} end
redis.call('HSET', KEYS[2], unpack(ARGV, 9))
local entry = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'job_id', ARGV[1])
redis.call('HSET', KEYS[2], 'stream', KEYS[3], 'entry_id', entry, 'inflight', KEYS[1])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SADD', KEYS[5], ARGV[8])
redis.call('ZADD', KEYS[4], ARGV[7], ARGV[1])
local extra = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[6])
if extra > 0 then redis.call('ZREMRANGEBYRANK', KEYS[4], 0, extra - 1) end
return {{'created', ARGV[1]}}
"""

# A fresh delivery starts only a queued job (a promoted job has two entries; the second one
# finds it running or finished); a takeover of a dead worker's entry also restarts a running one.
# KEYS: job. ARGV: now, worker, takeover ('1' or '0'), first stage ('lowering'; 'autotuning' for tune jobs).
START = f"""
local s = redis.call('HGET', KEYS[1], 'stage')
if s ~= 'queued' and not (ARGV[3] == '1' and {_RUNNING}) then return 0 end
redis.call('HSET', KEYS[1], 'stage', ARGV[4], 't:' .. ARGV[4], ARGV[1], 'started_at', ARGV[1], 'worker', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'attempt', 1)
return 1
"""

# KEYS: job. ARGV: stage, now.
STAGE = f"""
local s = redis.call('HGET', KEYS[1], 'stage')
if not {_RUNNING} then return 0 end
redis.call('HSET', KEYS[1], 'stage', ARGV[1], 't:' .. ARGV[1], ARGV[2])
return 1
"""

# Finishing also drops the single-flight entry, but only if it still points at this job. A compile
# job's entry is the inflight key of its artifact key; a tune job names its own in field 'inflight'.
# KEYS: job. ARGV: job id, job ttl s, inflight key prefix, final stage, now, then fields.
FINISH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'stage', ARGV[4], 't:' .. ARGV[4], ARGV[5], 'finished_at', ARGV[5], unpack(ARGV, 6))
redis.call('EXPIRE', KEYS[1], ARGV[2])
local inflight = redis.call('HGET', KEYS[1], 'inflight') or (ARGV[3] .. redis.call('HGET', KEYS[1], 'key'))
if redis.call('GET', inflight) == ARGV[1] then redis.call('DEL', inflight) end
return 1
"""

# A running job back to its priority's stream (a tune job to its arch's tune stream, which its
# 'stream' field names). KEYS: job, interactive stream, precompile stream.
# ARGV: now, error JSON ('' keeps the old one), attempt change ('0' or '-1'), stream max len.
RETRY = f"""
local s = redis.call('HGET', KEYS[1], 'stage')
if not {_RUNNING} then return 0 end
redis.call('HSET', KEYS[1], 'stage', 'queued', 't:queued', ARGV[1], 'worker', '')
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[2]) end
if ARGV[3] ~= '0' then redis.call('HINCRBY', KEYS[1], 'attempt', ARGV[3]) end
local stream = KEYS[3]
if redis.call('HGET', KEYS[1], 'priority') == 'interactive' then stream = KEYS[2] end
if redis.call('HGET', KEYS[1], 'kind') == 'tune' then stream = redis.call('HGET', KEYS[1], 'stream') end
local entry = redis.call('XADD', stream, 'MAXLEN', '~', ARGV[4], '*', 'job_id', redis.call('HGET', KEYS[1], 'id'))
redis.call('HSET', KEYS[1], 'stream', stream, 'entry_id', entry)
return 1
"""

# Only a queued job can be cancelled; its stream entry goes with it.
# KEYS: job. ARGV: job id, job ttl s, inflight key prefix, now.
CANCEL = """
local s = redis.call('HGET', KEYS[1], 'stage')
if not s then return 'missing' end
if s ~= 'queued' then return 'conflict' end
redis.call('HSET', KEYS[1], 'stage', 'cancelled', 't:cancelled', ARGV[4], 'finished_at', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[2])
local stream = redis.call('HGET', KEYS[1], 'stream')
local entry = redis.call('HGET', KEYS[1], 'entry_id')
if stream and entry then redis.call('XDEL', stream, entry) end
local inflight = redis.call('HGET', KEYS[1], 'inflight') or (ARGV[3] .. redis.call('HGET', KEYS[1], 'key'))
if redis.call('GET', inflight) == ARGV[1] then redis.call('DEL', inflight) end
return 'cancelled'
"""

# A heartbeat keeps the single-flight entry of a job being compiled (or tuned) from expiring.
# KEYS: job. ARGV: inflight key prefix, job id, ttl ms.
RENEW = """
local key = redis.call('HGET', KEYS[1], 'key')
if not key then return 0 end
local inflight = redis.call('HGET', KEYS[1], 'inflight') or (ARGV[1] .. key)
if redis.call('GET', inflight) ~= ARGV[2] then return 0 end
return redis.call('PEXPIRE', inflight, ARGV[3])
"""

# A cache look-up in one round trip: the manifest, its signature ('' for none) and, when ARGV[2]
# is '1', digest/blob pairs for the digests the manifest names (found by pattern; the caller checks
# them against the parsed manifest). A manifest whose blobs are gone (evicted from an allkeys-lru
# cache) is a miss. Counted as a hit or miss unless ARGV[3] is '0'.
# KEYS: manifest, signature, counters. ARGV: blob key prefix, want blobs, count.
LOOKUP = """
local function counted(name)
  if ARGV[3] ~= '0' then redis.call('HINCRBY', KEYS[3], name, 1) end
end
local m = redis.call('GET', KEYS[1])
if not m then
  counted('misses')
  return {}
end
local out = {m, redis.call('GET', KEYS[2]) or ''}
local seen = {}
for d in string.gmatch(m, '"digest":"(%x+)"') do
  if not seen[d] then
    seen[d] = true
    if ARGV[2] == '1' then
      local blob = redis.call('GET', ARGV[1] .. d)
      if not blob then counted('misses') return {} end
      out[#out + 1] = d
      out[#out + 1] = blob
    elseif redis.call('EXISTS', ARGV[1] .. d) == 0 then
      counted('misses')
      return {}
    end
  end
end
counted('hits')
return out
"""

# A pre-AOT entry goes in only while the artifact it names has a manifest: an entry never points at
# nothing when it is written (the artifact may still be evicted or removed later).
# KEYS: manifest, entry. ARGV: entry JSON, ttl s.
PUT_PRE_AOT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return 1
"""
