"""The Lua scripts RedisStore runs: each one state transition of a job, atomic on the queue's Redis."""

from __future__ import annotations

_RUNNING = ("(s == 'lowering' or s == 'building' or s == 'autotuning' or s == 'storing')")
_FINISHED = "(s == 'done' or s == 'failed' or s == 'cancelled')"

# Principals: a job's field 'principals' lists (comma-separated; token names have no commas) who is
# attached to it; each is charged one job and the request's bytes in its quota hash while the job is
# unfinished. _RELEASE gives those charges back; every script that ends a job calls it.
_HAS_PRINCIPAL = "string.find(',' .. ps .. ',', ',' .. p .. ',', 1, true)"

# ARGs: job key, quota key prefix.
_RELEASE = """
local function release(job, qprefix)
  local bytes = tonumber(redis.call('HGET', job, 'bytes') or '0')
  for p in string.gmatch(redis.call('HGET', job, 'principals') or '', '[^,]+') do
    local q = qprefix .. p
    redis.call('HINCRBY', q, 'bytes', -bytes)
    if redis.call('HINCRBY', q, 'jobs', -1) <= 0 then redis.call('DEL', q) end
  end
end
"""

# Note: submit is one script so that "a live job for this key?" and "queue a new job" happen
# atomically; two identical requests can never both create a job, on any number of API replicas.
# A done job keeps the key's entry (FINISH): a request that looked for the artifact just before the
# job stored it finds the done job here ('finished'), reads the artifact again and queues nothing;
# it passes the done job's id (ARGV[14]) only when that artifact is gone (deleted, evicted).
# A request that joins a live job attaches its principal to it (charged, but never refused: the
# job costs the cluster nothing more); a new job is refused over the principal's quotas first,
# then over the stream's cap.
# KEYS: inflight, job, stream, interactive stream, recent-jobs zset, request, principal's quota hash,
#       principal's jobs zset.
# ARGV: job id, job key prefix, inflight ttl ms, job ttl s, priority, stream max len, recent max,
#       created_at, principal, request bytes, quota jobs, quota bytes, request JSON, a done job to pass
#       over ('' for none), then the job's fields.
SUBMIT = f"""
local p = ARGV[9]
local function trimmed(zset)
  local extra = redis.call('ZCARD', zset) - tonumber(ARGV[7])
  if extra > 0 then redis.call('ZREMRANGEBYRANK', zset, 0, extra - 1) end
  redis.call('EXPIRE', zset, ARGV[4])
end
local function charge(bytes)
  redis.call('HINCRBY', KEYS[7], 'jobs', 1)
  redis.call('HINCRBY', KEYS[7], 'bytes', bytes)
  redis.call('EXPIRE', KEYS[7], ARGV[4])
end
local function attach(job, id)
  local ps = redis.call('HGET', job, 'principals') or ''
  if {_HAS_PRINCIPAL} then return end
  redis.call('HSET', job, 'principals', ps == '' and p or (ps .. ',' .. p))
  charge(redis.call('HGET', job, 'bytes') or '0')
  redis.call('ZADD', KEYS[8], redis.call('HGET', job, 'created_at'), id)
  trimmed(KEYS[8])
end
local existing = redis.call('GET', KEYS[1])
if existing then
  local job = ARGV[2] .. existing
  local s = redis.call('HGET', job, 'stage')
  if s == 'queued' and ARGV[5] == 'interactive' and redis.call('HGET', job, 'priority') == 'precompile' then
    -- A user now waits on a background job: queue it again where workers look first.
    local entry = redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'job_id', existing)
    redis.call('HSET', job, 'priority', 'interactive', 'stream', KEYS[4], 'entry_id', entry)
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    attach(job, existing)
    return {{'promoted', existing}}
  end
  if s == 'queued' or {_RUNNING} then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    attach(job, existing)
    return {{'joined', existing}}
  end
  if s == 'done' and existing ~= ARGV[14] then return {{'finished', existing}} end
end
local held = redis.call('HMGET', KEYS[7], 'jobs', 'bytes')
local jobs, bytes = tonumber(held[1] or '0'), tonumber(held[2] or '0')
if jobs + 1 > tonumber(ARGV[11]) then return {{'quota_jobs', tostring(jobs)}} end
if bytes + tonumber(ARGV[10]) > tonumber(ARGV[12]) then return {{'quota_bytes', tostring(bytes)}} end
if redis.call('XLEN', KEYS[3]) >= tonumber(ARGV[6]) then return {{'full', ''}} end
redis.call('HSET', KEYS[2], unpack(ARGV, 15))
redis.call('SET', KEYS[6], ARGV[13], 'EX', ARGV[4])
local entry = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'job_id', ARGV[1])
redis.call('HSET', KEYS[2], 'stream', KEYS[3], 'entry_id', entry)
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('ZADD', KEYS[5], ARGV[8], ARGV[1])
trimmed(KEYS[5])
charge(ARGV[10])
redis.call('ZADD', KEYS[8], ARGV[8], ARGV[1])
trimmed(KEYS[8])
return {{'created', ARGV[1]}}
"""

# Note: one tune job per artifact key in flight, as SUBMIT keeps one compile job per key. The tune
# job copies the compile request (the tuner re-derives the schedule from it); the stored artifact
# itself is read by the worker that takes the job.
# A tune job has no principal (a worker queues it): only admins see it, and it counts against no quota.
# Build tasks are queued by this script too (one per kernel: the build stream, its own single-flight
# key, the build archs set and the build tasks' own recent zset).
# KEYS: tune inflight, job, tune stream, recent-jobs zset, tune archs set, request.
# ARGV: job id, job key prefix, inflight ttl ms, job ttl s, stream max len, recent max, created_at,
#       arch, request JSON, then the job's fields.
SUBMIT_TUNE = f"""
local existing = redis.call('GET', KEYS[1])
if existing then
  local s = redis.call('HGET', ARGV[2] .. existing, 'stage')
  if s == 'queued' or {_RUNNING} then return {{'joined', existing}} end
end
if redis.call('XLEN', KEYS[3]) >= tonumber(ARGV[5]) then return {{'full', ''}} end
redis.call('HSET', KEYS[2], unpack(ARGV, 10))
redis.call('SET', KEYS[6], ARGV[9], 'EX', ARGV[4])
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

# Failing also drops the single-flight entry, but only if it still points at this job; a done job
# keeps it until its TTL (SUBMIT's note says why; tune and build submits pass over a done job). A
# compile job's entry is the inflight key of its artifact key; a tune job names its own in field 'inflight'.
# A finished job (an admin aborted it meanwhile) stays as it is: no finished stage is ever left.
# The request body goes, and the principals' quotas are released.
# KEYS: job, request. ARGV: job id, job ttl s, inflight key prefix, final stage, now, quota key prefix,
# then fields.
FINISH = _RELEASE + f"""
local s = redis.call('HGET', KEYS[1], 'stage')
if not s or {_FINISHED} then return 0 end
release(KEYS[1], ARGV[6])
redis.call('HSET', KEYS[1], 'stage', ARGV[4], 't:' .. ARGV[4], ARGV[5], 'finished_at', ARGV[5], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[2])
local inflight = redis.call('HGET', KEYS[1], 'inflight') or (ARGV[3] .. redis.call('HGET', KEYS[1], 'key'))
if ARGV[4] ~= 'done' and redis.call('GET', inflight) == ARGV[1] then redis.call('DEL', inflight) end
return 1
"""

# A running job back to its priority's stream (a tune job to its arch's tune stream, a build task to
# the build stream: its 'stream' field names them). KEYS: job, interactive stream, precompile stream.
# ARGV: now, error JSON ('' keeps the old one), attempt change ('0' or '-1'), stream max len.
RETRY = f"""
local s = redis.call('HGET', KEYS[1], 'stage')
if not {_RUNNING} then return 0 end
redis.call('HSET', KEYS[1], 'stage', 'queued', 't:queued', ARGV[1], 'worker', '')
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[2]) end
if ARGV[3] ~= '0' then redis.call('HINCRBY', KEYS[1], 'attempt', ARGV[3]) end
local stream = KEYS[3]
if redis.call('HGET', KEYS[1], 'priority') == 'interactive' then stream = KEYS[2] end
local kind = redis.call('HGET', KEYS[1], 'kind')
if kind == 'tune' or kind == 'build' then stream = redis.call('HGET', KEYS[1], 'stream') end
local entry = redis.call('XADD', stream, 'MAXLEN', '~', ARGV[4], '*', 'job_id', redis.call('HGET', KEYS[1], 'id'))
redis.call('HSET', KEYS[1], 'stream', stream, 'entry_id', entry)
return 1
"""

# A principal's DELETE detaches it while other principals remain attached (its quota charge goes
# back); the last one's DELETE cancels a queued job. An admin's abort (ARGV[7], the error JSON)
# cancels a queued or running job: the worker running it sees the stage and stops.
# KEYS: job, request. ARGV: job id, job ttl s, inflight key prefix, now, quota key prefix,
#       principal ('' for an admin), abort error JSON ('' for none), principal jobs key prefix.
CANCEL = _RELEASE + f"""
local s = redis.call('HGET', KEYS[1], 'stage')
if not s then return 'missing' end
local p = ARGV[6]
if p ~= '' then
  local ps = redis.call('HGET', KEYS[1], 'principals') or ''
  if not {_HAS_PRINCIPAL} then return 'missing' end
  if ps ~= p then
    if {_FINISHED} then return 'conflict' end
    local kept = {{}}
    for q in string.gmatch(ps, '[^,]+') do if q ~= p then kept[#kept + 1] = q end end
    redis.call('HSET', KEYS[1], 'principals', table.concat(kept, ','))
    local quota = ARGV[5] .. p
    redis.call('HINCRBY', quota, 'bytes', -tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0'))
    if redis.call('HINCRBY', quota, 'jobs', -1) <= 0 then redis.call('DEL', quota) end
    redis.call('ZREM', ARGV[8] .. p, ARGV[1])
    return 'detached'
  end
end
if not (s == 'queued' or (ARGV[7] ~= '' and {_RUNNING})) then return 'conflict' end
release(KEYS[1], ARGV[5])
redis.call('HSET', KEYS[1], 'stage', 'cancelled', 't:cancelled', ARGV[4], 'finished_at', ARGV[4])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[7]) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[2])
-- A running job's entry is its worker's: it is acknowledged (and deleted) when the worker lets go.
if s == 'queued' then
  local stream = redis.call('HGET', KEYS[1], 'stream')
  local entry = redis.call('HGET', KEYS[1], 'entry_id')
  if stream and entry then redis.call('XDEL', stream, entry) end
end
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
# is '1', digest/blob pairs for the digests the manifest names (found by pattern; fetch_artifact
# checks them against the parsed manifest, the hit routes pass them on as they are and the client
# checks them against the signed manifest). A manifest whose blobs are gone (evicted from an allkeys-lru
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
for d in string.gmatch(m, '"digest"%s*:%s*"(%x+)"') do
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

# A bundle (compiler_core/bundle.py) goes in only while every member's manifest is the one it
# frames (compared by sha1): a tuned copy or a delete that landed while it was assembled leaves it
# out. Each member's set of bundles names it, so that replacing or deleting that artifact deletes it
# (RedisCache._put_manifest, delete_artifact; they WATCH that set).
# KEYS: bundle, then each member's manifest, then each member's bundles set. ARGV: bundle bytes,
# ttl s, then the sha1 hex of each member's manifest.
STORE_BUNDLE = """
local n = (#KEYS - 1) / 2
for i = 1, n do
  local m = redis.call('GET', KEYS[1 + i])
  if not m or redis.sha1hex(m) ~= ARGV[2 + i] then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
for i = 1, n do
  redis.call('SADD', KEYS[1 + n + i], KEYS[1])
  redis.call('EXPIRE', KEYS[1 + n + i], ARGV[2])
end
return 1
"""

# A pre-AOT entry goes in only while the artifact it names has a manifest: an entry never points at
# nothing when it is written (the artifact may still be evicted or removed later).
# KEYS: manifest, entry. ARGV: entry JSON, ttl s.
PUT_PRE_AOT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return 1
"""

# A principal's quota charges counted again from its jobs: what is charged while a job is unfinished
# and the principal attached to it. The counters drift when a job's record goes without a script
# ending it (it expired, or Redis lost it): RedisStore.submit recounts before it refuses over a
# quota (at most every RECOUNT_EVERY_S per principal), so a drifted counter never locks anyone out.
# KEYS: principal's quota hash, principal's jobs zset. ARGV: principal, job key prefix, job ttl s.
RECOUNT = f"""
local p = ARGV[1]
local jobs, bytes = 0, 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local f = redis.call('HMGET', ARGV[2] .. id, 'stage', 'principals', 'bytes')
  local s, ps = f[1], f[2] or ''
  if s and not {_FINISHED} and {_HAS_PRINCIPAL} then
    jobs = jobs + 1
    bytes = bytes + tonumber(f[3] or '0')
  end
end
redis.call('DEL', KEYS[1])
if jobs > 0 then
  redis.call('HSET', KEYS[1], 'jobs', jobs, 'bytes', bytes)
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return {{jobs, bytes}}
"""
