#!lua name=velocity
-- Velocity's Redis Functions (Redis 7.0+). Loaded by `velocity` with FUNCTION LOAD REPLACE.
--
-- A (signature, key) is one hash; each field is a bucket start (epoch ms) and each value a
-- JSON array [event_count, value_count, sum, min, max, [distinct values]] with sum, min and
-- max as exact decimal strings (or null). Decimals are added and compared as digit strings
-- so no amount is ever rounded through a double.

local function split(s)
  local int, frac = string.match(s, "^(%d+)%.?(%d*)$")
  return int, frac
end

local function normalize(int, frac)
  int = string.gsub(int, "^0+", "")
  if int == "" then int = "0" end
  frac = string.gsub(frac, "0+$", "")
  if frac == "" then return int end
  return int .. "." .. frac
end

-- a + b for non-negative decimal strings (amounts are never negative).
local function dec_add(a, b)
  local ai, af = split(a)
  local bi, bf = split(b)
  local scale = math.max(#af, #bf)
  local x = ai .. af .. string.rep("0", scale - #af)
  local y = bi .. bf .. string.rep("0", scale - #bf)
  local n = math.max(#x, #y)
  x = string.rep("0", n - #x) .. x
  y = string.rep("0", n - #y) .. y
  local out, carry = {}, 0
  for k = n, 1, -1 do
    local d = string.byte(x, k) + string.byte(y, k) - 96 + carry
    out[k] = d % 10
    carry = (d - d % 10) / 10
  end
  local digits = table.concat(out)
  if carry > 0 then digits = carry .. digits end
  return normalize(string.sub(digits, 1, #digits - scale), string.sub(digits, #digits - scale + 1))
end

-- -1, 0 or 1 as a <, =, > b for non-negative decimal strings.
local function dec_cmp(a, b)
  local ai, af = split(a)
  local bi, bf = split(b)
  ai = string.gsub(ai, "^0+", "")
  bi = string.gsub(bi, "^0+", "")
  if #ai ~= #bi then return #ai < #bi and -1 or 1 end
  if ai ~= bi then return ai < bi and -1 or 1 end
  local scale = math.max(#af, #bf)
  af = af .. string.rep("0", scale - #af)
  bf = bf .. string.rep("0", scale - #bf)
  if af == bf then return 0 end
  return af < bf and -1 or 1
end

-- a / n rounded half-even to `places` decimals (a a decimal string, n a positive integer).
local function dec_div(a, n, places)
  local ai, af = split(a)
  -- sums of amounts carry at most 8 places, so padding to `places` = 8 drops nothing
  local digits = ai .. string.sub(af .. string.rep("0", places), 1, places)
  local q, r = {}, 0
  for k = 1, #digits do
    r = r * 10 + string.byte(digits, k) - 48
    local d = math.floor(r / n)
    q[k] = d
    r = r - d * n
  end
  local quotient = table.concat(q)
  local last = tonumber(string.sub(quotient, -1))
  if 2 * r > n or (2 * r == n and last % 2 == 1) then
    quotient = dec_add(quotient, "1")
  end
  quotient = string.rep("0", places + 1 - #quotient) .. quotient
  return normalize(string.sub(quotient, 1, #quotient - places), string.sub(quotient, #quotient - places + 1))
end

-- velocity_window names the window's buckets (HMGET) when it spans fewer starts than this.
local WINDOW_HMGET_MAX = 1024

local function floor_to(v, width)
  return v - (v % width)
end

-- FCALL velocity_window 1 <bucket hash> <aggregator> <window ms> <bucket ms> [at ms]
-- The aggregate of the buckets whose start lies in [floor_g(T - W), T], T = at or now.
local function velocity_window(keys, args)
  local aggregator = string.upper(args[1])
  local window_ms = tonumber(args[2])
  local bucket_ms = tonumber(args[3])
  local at = tonumber(args[4] or "")
  if at == nil then
    local now = redis.call("TIME")
    at = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  end
  local lower = floor_to(at - window_ms, bucket_ms)
  local count, value_count, sum, min, max = 0, 0, nil, nil, nil
  local distinct, distinct_count = {}, 0
  -- The window's own buckets: named one by one (HMGET) when the window spans few bucket
  -- starts (a narrow rule on a hash that a wide rule keeps long), else the whole hash.
  local values = {}
  local last = floor_to(at, bucket_ms)
  if last >= lower and (last - lower) / bucket_ms < WINDOW_HMGET_MAX then
    local names = {}
    for start = lower, last, bucket_ms do names[#names + 1] = string.format("%.0f", start) end
    for _, value in ipairs(redis.call("HMGET", keys[1], unpack(names))) do
      if value then values[#values + 1] = value end
    end
  else
    local fields = redis.call("HGETALL", keys[1])
    for i = 1, #fields, 2 do
      local start = tonumber(fields[i])
      if start >= lower and start <= at then values[#values + 1] = fields[i + 1] end
    end
  end
  for _, text in ipairs(values) do
    local b = cjson.decode(text)
    count = count + b[1]
    value_count = value_count + b[2]
    if b[3] ~= cjson.null then
      sum = sum and dec_add(sum, b[3]) or b[3]
      if min == nil or dec_cmp(b[4], min) < 0 then min = b[4] end
      if max == nil or dec_cmp(b[5], max) > 0 then max = b[5] end
    end
    if aggregator == "UNIQUE_COUNT" then
      for _, v in ipairs(b[6]) do
        if not distinct[v] then
          distinct[v] = true
          distinct_count = distinct_count + 1
        end
      end
    end
  end
  local value = cjson.null
  if aggregator == "COUNT" then
    value = tostring(count)
  elseif aggregator == "UNIQUE_COUNT" then
    value = tostring(distinct_count)
  elseif aggregator == "SUM" and sum then
    value = normalize(split(sum))
  elseif aggregator == "MIN" and min then
    value = normalize(split(min))
  elseif aggregator == "MAX" and max then
    value = normalize(split(max))
  elseif aggregator == "AVG" and sum and value_count > 0 then
    value = dec_div(sum, value_count, 8)
  end
  return cjson.encode({
    aggregateValue = value,
    windowStart = lower,
    windowEnd = at,
    eventCount = count,
  })
end

-- FCALL velocity_evict 1 <bucket hash> <cutoff ms>
-- Drops the buckets that start before the cutoff; returns how many were dropped.
local function velocity_evict(keys, args)
  local cutoff = tonumber(args[1])
  local dropped = 0
  local starts = redis.call("HKEYS", keys[1])
  for _, start in ipairs(starts) do
    if tonumber(start) < cutoff then
      redis.call("HDEL", keys[1], start)
      dropped = dropped + 1
    end
  end
  return dropped
end

-- FCALL velocity_publish_backfill 1 <alert stream> <maxlen> <alert json> ...
-- Appends a backfill's corrections and retractions. Each entry repeats the batch of the
-- stream's last entry (a consumer reading by batch sees it after that batch).
local function velocity_publish_backfill(keys, args)
  local maxlen = args[1]
  local batch = "-1"
  local last = redis.call("XREVRANGE", keys[1], "+", "-", "COUNT", 1)
  if #last > 0 then
    local entry = last[1][2]
    for i = 1, #entry, 2 do
      if entry[i] == "batch" then batch = entry[i + 1] end
    end
  end
  for i = 2, #args do
    redis.call("XADD", keys[1], "MAXLEN", "~", maxlen, "*", "alert", args[i], "batch", batch,
               "backfill", "1")
  end
  return #args - 1
end

-- Is the lock value ``held`` (the holder's JSON) the one with this exact token?
local function held_by(held, token)
  if not held then return false end
  local ok, value = pcall(cjson.decode, held)
  return ok and type(value) == "table" and value["token"] == token
end

-- FCALL velocity_unlock 1 <lock key> <token>
-- Releases a lock only for the holder that took it (its token), never someone else's.
local function velocity_unlock(keys, args)
  local held = redis.call("GET", keys[1])
  if held_by(held, args[1]) then
    return redis.call("DEL", keys[1])
  end
  return 0
end

-- FCALL velocity_renew 1 <lock key> <token> <lease ms>
-- Extends a lock's lease only for the holder that took it; 0 when it is no longer held.
local function velocity_renew(keys, args)
  local held = redis.call("GET", keys[1])
  if held_by(held, args[1]) then
    return redis.call("PEXPIRE", keys[1], args[2])
  end
  return 0
end

-- FCALL_RO velocity_stream_read 3 <progress hash> <buckets epoch> <mirror marker> <request json>
-- The read half of a micro-batch, in one round trip: the stream's progress (last committed
-- batch, newest eventTime), the buckets epoch, the mirror marker, which of the named
-- transactionId keys exist, and the named bucket hashes whole.
-- request = {"h": [bucket hash, ...], "s": [seen key, ...]}
-- reply = {"p": {field: value}, "e": epoch, "m": marker, "s": [1-based indices seen],
--          "h": {hash: {start: value}}} (empty hashes left out)
local function velocity_stream_read(keys, args)
  local request = cjson.decode(args[1])
  local progress = {}
  local fields = redis.call("HGETALL", keys[1])
  for i = 1, #fields, 2 do progress[fields[i]] = fields[i + 1] end
  local seen = {}
  for i, name in ipairs(request["s"]) do
    if redis.call("EXISTS", name) == 1 then seen[#seen + 1] = i end
  end
  local hashes = {}
  for _, name in ipairs(request["h"]) do
    local buckets = redis.call("HGETALL", name)
    if #buckets > 0 then
      local map = {}
      for i = 1, #buckets, 2 do map[buckets[i]] = buckets[i + 1] end
      hashes[name] = map
    end
  end
  return cjson.encode({
    p = progress,
    e = redis.call("GET", keys[2]) or "0",
    m = redis.call("GET", keys[3]) or "",
    s = seen,
    h = hashes,
  })
end

-- FCALL velocity_stream_commit 3 <progress hash> <alert stream> <state lock> <lock token>
--   <batch> <newest eventTime> <bucket ttl ms> <seen ttl ms> <alert maxlen> <changes json>...
-- The write half of a micro-batch, atomic: every changed bucket's absolute value (and its
-- hash's TTL), the buckets dropped below the horizon, the accepted transactionIds, the
-- alerts on the stream, and the progress (with "at", the time of this commit). Fenced:
-- unless the state lock holds the caller's token (its lease ran out, someone else may be
-- writing) nothing is written and -2 returned. A batch not newer than the progress was
-- committed already: nothing is written and -1 returned (a replay changes nothing twice).
-- changes = {"b": [[hash, start, value], ...], "d": [[hash, start], ...],
--            "s": [seen key, ...], "a": [alert json, ...]}, in one or more parts (each
--            argument a part of every list, in order, so no argument grows without bound)
local function velocity_stream_commit(keys, args)
  if not held_by(redis.call("GET", keys[3]), args[1]) then return -2 end
  local batch = tonumber(args[2])
  local last = redis.call("HGET", keys[1], "batch")
  if last and tonumber(last) >= batch then return -1 end
  local parts = {}
  for i = 7, #args do parts[#parts + 1] = cjson.decode(args[i]) end
  -- Kind by kind over all parts: a bucket both changed and dropped ends dropped.
  local touched, published = {}, 0
  for _, changes in ipairs(parts) do
    for _, b in ipairs(changes["b"]) do
      redis.call("HSET", b[1], b[2], b[3])
      touched[b[1]] = true
    end
  end
  for _, changes in ipairs(parts) do
    for _, d in ipairs(changes["d"]) do redis.call("HDEL", d[1], d[2]) end
  end
  for name in pairs(touched) do
    redis.call("PEXPIRE", name, args[4])
  end
  for _, changes in ipairs(parts) do
    for _, name in ipairs(changes["s"]) do redis.call("SET", name, args[2], "PX", args[5]) end
  end
  for _, changes in ipairs(parts) do
    for _, alert in ipairs(changes["a"]) do
      redis.call("XADD", keys[2], "MAXLEN", "~", args[6], "*", "alert", alert, "batch", args[2])
      published = published + 1
    end
  end
  local now = redis.call("TIME")
  local at = tostring(tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
  redis.call("HSET", keys[1], "batch", args[2], "newest", args[3], "at", at)
  return published
end

redis.register_function{function_name = "velocity_window", callback = velocity_window,
                        flags = {"no-writes"}}
redis.register_function("velocity_evict", velocity_evict)
redis.register_function("velocity_publish_backfill", velocity_publish_backfill)
redis.register_function("velocity_unlock", velocity_unlock)
redis.register_function("velocity_renew", velocity_renew)
redis.register_function{function_name = "velocity_stream_read", callback = velocity_stream_read,
                        flags = {"no-writes"}}
redis.register_function("velocity_stream_commit", velocity_stream_commit)
