#!lua name=velocity
-- Velocity's Redis Functions (Redis 7.0+). Loaded by `velocity` with FUNCTION LOAD REPLACE.
--
-- A (signature, key)'s state is one key, "<base>:buckets", in one of two layouts (see
-- packed_lines): packed, one string the stream reads and rewrites whole, while the key has
-- fewer than ROLLUP_MIN_BUCKETS buckets (nearly every key); dense, a hash with roll-ups.
-- Either holds fields: each bucket is named by its start (epoch ms) and its value is a
-- JSON array [event_count, value_count, sum, min, max, [distinct values]] with sum, min
-- and max as exact decimal strings (or null). A dense hash also holds roll-ups (see
-- ROLLUP_SIZES), fields whose names start with a letter. No amount is ever rounded: sums
-- and comparisons use doubles only where they are exact, else digit strings.

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

-- Comparisons and sums on the hot paths (a window's merge, a roll-up's refresh) take the
-- double fast path where it is exact and the digit-string one only where it is not.
local POW10 = {[0] = 1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000}
local FRAC_UNIT = 100000000 -- the fast sum keeps fractions in units of 10^-8
local EXACT_WHOLE = 4503599627370496 -- 2^52: whole parts below it (plus one amount) stay exact

-- a < b for non-negative decimal strings. Rounding to a double is monotonic, so doubles
-- that differ order their decimals; only equal doubles need the digits.
local function dec_less(a, b)
  local x, y = tonumber(a), tonumber(b)
  if x ~= y then return x < y end
  return dec_cmp(a, b) < 0
end

-- An exact running sum: whole and fractional parts as doubles while they stay exact
-- integers (amounts have at most 8 places), anything larger as a digit string.
local function sum_new()
  return {whole = 0, frac = 0, text = nil, any = false}
end

local function sum_carry(s)
  local carry = math.floor(s.frac / FRAC_UNIT)
  local rest = s.frac - carry * FRAC_UNIT
  if rest < 0 then carry, rest = carry - 1, rest + FRAC_UNIT end
  if rest >= FRAC_UNIT then carry, rest = carry + 1, rest - FRAC_UNIT end
  s.whole, s.frac = s.whole + carry, rest
end

-- Adds the decimal int.frac (its digits before and after the point).
local function sum_add_parts(s, int, frac)
  s.any = true
  if #int <= 15 and #frac <= 8 then
    s.whole = s.whole + int
    if #frac > 0 then s.frac = s.frac + frac * POW10[8 - #frac] end
    if s.frac >= 1e15 then sum_carry(s) end
    if s.whole >= EXACT_WHOLE then
      local whole = string.format("%.0f", s.whole)
      s.text = s.text and dec_add(s.text, whole) or whole
      s.whole = 0
    end
  else
    local value = #frac > 0 and (int .. "." .. frac) or int
    s.text = s.text and dec_add(s.text, value) or value
  end
end

local function sum_add(s, value)
  local int, frac = split(value)
  sum_add_parts(s, int, frac)
end

local function sum_total(s)
  if not s.any then return nil end
  sum_carry(s)
  local fast = normalize(string.format("%.0f", s.whole), string.format("%08d", s.frac))
  if s.text then return dec_add(s.text, fast) end
  return fast
end

-- A bucket value's head: event count, value count, sum, min, max (quoted or null), and
-- the position of the distinct values' list.
local BUCKET_HEAD = "^%[(%d+),(%d+),([^,]*),([^,]*),([^,]*),()"
-- What a window reads of a value: the event count and its aggregator's part (a decimal's
-- digits, empty for null; a sum's whole and fractional digits apart).
local COUNT_PART = "^%[(%d+),"
local SUM_PART = '^%[(%d+),(%d+),"?(%d*)%.?(%d*)'
local MIN_PART = '^%[(%d+),%d+,[^,]*,"?([%d%.]*)'
local MAX_PART = '^%[(%d+),%d+,[^,]*,[^,]*,"?([%d%.]*)'

-- An integer (a time in ms, a count) as digits: "%d" (64-bit) is exact below 2^53 and
-- twice as fast as "%.0f"; a lookup formats one per field it reads.
local function ms_text(v)
  return string.format("%d", v)
end

-- Redis's clock now, epoch ms (the one clock every function reads).
local function clock_ms()
  local now = redis.call("TIME")
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- The merge of bucket values, every part of them (a roll-up's value).
local function merge_new()
  return {count = 0, value_count = 0, sum = sum_new(), min = nil, max = nil, distinct = {}}
end

local function merge_add(m, text)
  local count, value_count, sum, min, max, rest = string.match(text, BUCKET_HEAD)
  m.count = m.count + count
  m.value_count = m.value_count + value_count
  if sum ~= "null" then sum_add(m.sum, string.sub(sum, 2, -2)) end
  if min ~= "null" then
    min = string.sub(min, 2, -2)
    if m.min == nil or dec_less(min, m.min) then m.min = min end
  end
  if max ~= "null" then
    max = string.sub(max, 2, -2)
    if m.max == nil or dec_less(m.max, max) then m.max = max end
  end
  if string.sub(text, rest, rest + 1) ~= "[]" then
    for _, v in ipairs(cjson.decode(text)[6]) do
      m.distinct[v] = true
    end
  end
end

-- A merge as a bucket value (the format of the fields it merged, without a newest time).
local function merge_text(m)
  local function quoted(v) return v and ('"' .. v .. '"') or "null" end
  local values = {}
  for v in pairs(m.distinct) do values[#values + 1] = v end
  table.sort(values)
  for i, v in ipairs(values) do values[i] = cjson.encode(v) end
  return "[" .. ms_text(m.count) .. "," .. ms_text(m.value_count)
      .. "," .. quoted(sum_total(m.sum)) .. "," .. quoted(m.min) .. "," .. quoted(m.max)
      .. ",[" .. table.concat(values, ",") .. "]]"
end

local function floor_to(v, width)
  return v - (v % width)
end

-- Bucket fields are named by their start (digits); roll-ups and the flag by a letter.
local function is_bucket(field)
  local first = string.byte(field, 1)
  return first ~= nil and first >= 48 and first <= 57
end

-- A bucket's raw events, kept in its hash (field "~<start>") until a later batch adds to
-- them: most buckets get all their events in one batch, and then need no key of their own.
local function is_raw(field)
  return string.byte(field, 1) == 126
end

-- A rule version's last notified alert of the key (field "n:<ruleId>:<version>", value
-- [eventTime, "transactionId"]): the cooldown's state (SPEC §3), kept with the buckets.
local function is_notified(field)
  return string.sub(field, 1, 2) == "n:"
end

-- Runs `command key items...` over `items[first..last]` in slices: Lua's unpack has a
-- limit. Even slices, so (field, value) pairs stay whole.
local function in_slices(command, key, items, first, last)
  for from = first or 1, last or #items, 2000 do
    redis.call(command, key, unpack(items, from, math.min(from + 1999, last or #items)))
  end
end

-- Roll-ups. A dense hash (ROLLUP_MIN_BUCKETS buckets or more) also holds, for each size n
-- (in buckets) of ROLLUP_SIZES, the merge of the buckets of every aligned n·g block that
-- has any, as field "r<n>:<block start>", and field "rollups" = "<g ms>:<n>,<n>,...". Each
-- size divides the next, so a block is the merge of the blocks one size down. A window
-- then reads the largest blocks that fit in it whole and single buckets only at its edges:
-- at most 31 fields for 24 h at g = 1 s instead of 86 400. A sparse hash has none (its
-- writes cost one HLEN more) and is read whole: it has fewer than ROLLUP_MIN_BUCKETS.
local ROLLUP_SIZES = {4, 16, 64, 256, 1024, 4096, 16384, 65536}
local ROLLUP_MIN_BUCKETS = 128
-- A hash whose fields fall below this loses its roll-ups (it is sparse again), so a hash
-- with fewer fields than this has none: the stream's commit checks one HLEN, no flag.
local ROLLUP_KEEP_FIELDS = 64
local ROLLUP_FLAG = "rollups"

local function block_name(size, start)
  return "r" .. size .. ":" .. ms_text(start)
end

-- The bucket width and block sizes of a hash's roll-ups; nil when it has none. Parsed once
-- per flag value (the library's state lives as long as it is loaded).
local layouts = {}

local function rollup_layout(hash)
  local flag = redis.call("HGET", hash, ROLLUP_FLAG)
  if not flag then return nil end
  local layout = layouts[flag]
  if not layout then
    local width, list = string.match(flag, "^(%d+):(.*)$")
    layout = {width = tonumber(width), sizes = {}}
    for n in string.gmatch(list, "%d+") do layout.sizes[#layout.sizes + 1] = tonumber(n) end
    layouts[flag] = layout
  end
  return layout.width, layout.sizes
end

-- Recompute, level by level, the blocks that hold the bucket starts `starts` (a set), each
-- from the level below: written when it has any bucket, removed when it has none.
local function refresh_blocks(hash, width, sizes, starts)
  local below, below_size = starts, 1
  for _, size in ipairs(sizes) do
    local span, step = size * width, below_size * width
    local blocks = {}
    for start in pairs(below) do blocks[floor_to(start, span)] = true end
    for block in pairs(blocks) do
      local names = {}
      for child = block, block + span - step, step do
        names[#names + 1] = below_size == 1 and ms_text(child) or block_name(below_size, child)
      end
      local merged, any = merge_new(), false
      for _, text in ipairs(redis.call("HMGET", hash, unpack(names))) do
        if text then
          merge_add(merged, text)
          any = true
        end
      end
      if any then
        redis.call("HSET", hash, block_name(size, block), merge_text(merged))
      else
        redis.call("HDEL", hash, block_name(size, block))
      end
    end
    below, below_size = blocks, size
  end
end

-- Keep a hash's roll-ups in step once its buckets `starts` (a set of numbers) changed.
-- With the bucket width `width`, a hash that has become dense gets its roll-ups built.
local function after_bucket_writes(hash, starts, width)
  local layout_width, sizes = rollup_layout(hash)
  if layout_width then
    refresh_blocks(hash, layout_width, sizes, starts)
    if redis.call("HLEN", hash) < ROLLUP_KEEP_FIELDS then -- sparse again: read whole
      for _, field in ipairs(redis.call("HKEYS", hash)) do
        if not is_bucket(field) and not is_raw(field) and not is_notified(field) then
          redis.call("HDEL", hash, field)
        end
      end
    end
  elseif width and redis.call("HLEN", hash) >= ROLLUP_MIN_BUCKETS then
    local all = {}
    for _, field in ipairs(redis.call("HKEYS", hash)) do
      if is_bucket(field) then all[tonumber(field)] = true end
    end
    refresh_blocks(hash, width, ROLLUP_SIZES, all)
    redis.call("HSET", hash, ROLLUP_FLAG, ms_text(width) .. ":" .. table.concat(ROLLUP_SIZES, ","))
  end
end

-- Drops a hash's buckets that start before `cutoff`, adding their starts to the set
-- `dropped`; returns how many.
local function drop_before(hash, cutoff, dropped)
  local count = 0
  for _, field in ipairs(redis.call("HKEYS", hash)) do
    if is_bucket(field) and tonumber(field) < cutoff then
      redis.call("HDEL", hash, field)
      dropped[tonumber(field)] = true
      count = count + 1
    end
  end
  return count
end

-- The packed layout: the fields a hash would hold as lines "<field>\t<value>\n" (no field
-- or value holds a tab or a newline: values are JSON, control characters escaped), in one
-- string. A batch reads it (an MGET of the batch's keys) and writes it with one SET, where
-- a hash costs an HSET, a PEXPIRE and a dozen arguments a key. A key reaching
-- ROLLUP_MIN_BUCKETS buckets turns dense (a window over 86 400 buckets must not read them
-- all): its fields and roll-ups move to the hash "<base>:dense", and its state string holds
-- DENSE_TEXT only, so that every key's state is still one string a read can MGET.
local HASH_MARK = "#"
local DENSE_TEXT = HASH_MARK .. "\t\n"
-- Each commit records this layout in the stream's progress (velocity/redis/mirror.py's
-- STATE_LAYOUT): a data dir whose progress lacks it is in the layout before.
local STATE_LAYOUT = "packed"

-- The hash of a dense key's fields, from its state's name "<base>:buckets".
local function dense_of(name)
  return string.sub(name, 1, -9) .. ":dense"
end

-- A key's layout and, when packed, its text: ("packed", text), ("dense", nil) or nil.
local function key_layout(name)
  local value = redis.pcall("GET", name)
  if type(value) == "table" then
    error("velocity: " .. name .. " is a hash, the layout before Velocity 0.3: run "
          .. "`velocity mirror migrate` once")
  end
  if not value then return nil, nil end
  if value == DENSE_TEXT then return "dense", nil end
  return "packed", value
end

-- The (field, value) lines of a packed `text` in order, raw-events lines left out unless
-- `with_raw`. Found with plain finds (memchr), and a skipped line's value never copied: a
-- pattern's per-character match over a hot key's raw events (megabytes) held a check for
-- tens of milliseconds.
local function packed_lines(text, with_raw)
  local pos, size = 1, #(text or "")
  return function()
    while pos <= size do
      local tab = string.find(text, "\t", pos, true)
      local line_end = tab and string.find(text, "\n", tab + 1, true)
      if not line_end then return nil end
      local from = pos
      pos = line_end + 1
      if with_raw or string.byte(text, from) ~= 126 then
        return string.sub(text, from, tab - 1), string.sub(text, tab + 1, line_end - 1)
      end
    end
    return nil
  end
end

local function packed_fields(text, with_raw)
  local fields = {}
  for field, value in packed_lines(text, with_raw) do fields[field] = value end
  return fields
end

local function packed_text(fields)
  local lines = {}
  for field, value in pairs(fields) do lines[#lines + 1] = field .. "\t" .. value .. "\n" end
  return table.concat(lines)
end

-- A hash's state fields (buckets, raw events, last notified alerts; roll-ups left out) as a
-- table, and how many buckets it has.
local function state_fields(hash)
  local fields, buckets, all = {}, 0, redis.call("HGETALL", hash)
  for i = 1, #all, 2 do
    local field = all[i]
    if is_bucket(field) then buckets = buckets + 1 end
    if is_bucket(field) or is_raw(field) or is_notified(field) then fields[field] = all[i + 1] end
  end
  return fields, buckets
end

-- Drops the buckets of a packed key's `fields` that start before `cutoff`; how many.
local function drop_fields_before(fields, cutoff)
  local count = 0
  for field in pairs(fields) do
    if is_bucket(field) and tonumber(field) < cutoff then
      fields[field] = nil
      count = count + 1
    end
  end
  return count
end

-- Turns a key dense: its fields (`flat`, field value ...) into its hash, with roll-ups, and
-- DENSE_TEXT into its state string; the TTL `ttl_ms` on both (none when nil).
local function store_dense(name, flat, first, last, width, ttl_ms)
  local hash = dense_of(name)
  redis.call("DEL", hash)
  in_slices("HSET", hash, flat, first, last)
  if ttl_ms then
    redis.call("SET", name, DENSE_TEXT, "PX", ttl_ms)
    redis.call("PEXPIRE", hash, ttl_ms)
  else
    redis.call("SET", name, DENSE_TEXT)
  end
  after_bucket_writes(hash, {}, width)
end

-- Rewrites a packed key whole from its `fields` (a table): dense when it has
-- ROLLUP_MIN_BUCKETS buckets (and `width`, the bucket ms, is known), else packed; gone when
-- it has no field. The TTL `ttl_ms`, or the key's own when "".
local function store_fields(name, fields, width, ttl_ms)
  local flat, buckets = {}, 0
  for field, value in pairs(fields) do
    flat[#flat + 1], flat[#flat + 2] = field, value
    if is_bucket(field) then buckets = buckets + 1 end
  end
  if #flat == 0 then
    redis.call("DEL", name)
    return
  end
  if ttl_ms == "" then
    ttl_ms = redis.call("PTTL", name)
    if ttl_ms <= 0 then ttl_ms = nil end
  end
  if width and buckets >= ROLLUP_MIN_BUCKETS then
    store_dense(name, flat, 1, #flat, width, ttl_ms)
  elseif ttl_ms then
    redis.call("SET", name, packed_text(fields), "PX", ttl_ms)
  else
    redis.call("SET", name, packed_text(fields))
  end
end

-- The fields whose merge is the buckets starting in [lo, hi] (multiples of `width`): from
-- lo on, the largest aligned block that fits whole, else a single bucket.
local function cover(lo, hi, width, sizes)
  local names, pos, top = {}, lo, #sizes
  local spans, prefixes = {}, {}
  for i = 1, top do
    spans[i] = sizes[i] * width
    prefixes[i] = "r" .. sizes[i] .. ":"
  end
  while pos <= hi do
    -- The largest block aligned at pos that ends by hi: none of a size larger than the one
    -- taken last fits once past the window's middle, so the search narrows as it goes.
    local i = top
    while i >= 1 and (pos % spans[i] ~= 0 or pos + spans[i] - width > hi) do i = i - 1 end
    if i >= 1 then
      names[#names + 1] = prefixes[i] .. ms_text(pos)
      pos = pos + spans[i]
      if pos + spans[i] - width > hi then top = i end
    else
      names[#names + 1] = ms_text(pos)
      pos = pos + width
    end
  end
  return names
end

-- What a window read may be asked, so that no call's work grows with its arguments: a rule's
-- aggregators, windows up to a rule's widest (velocity/domain/rules.py's
-- MAX_WINDOW_MINUTES, 366 days), the bucket widths a data dir may have (ALLOWED_BUCKET_SECONDS)
-- and a time of at most 16 digits. A 366-day window over 1 s buckets covers about 530
-- roll-up blocks and buckets: a few milliseconds.
local WINDOW_AGGREGATORS = {COUNT = true, SUM = true, AVG = true, MIN = true, MAX = true,
                            UNIQUE_COUNT = true}
local MAX_WINDOW_MS = 31622400000
local BUCKET_WIDTHS_MS = {[1000] = true, [2000] = true, [5000] = true, [10000] = true,
                          [15000] = true, [20000] = true, [30000] = true, [60000] = true}

-- A whole number of at most 16 digits, or nil.
local function whole_ms(text)
  if type(text) ~= "string" or not string.match(text, "^%d+$") or #text > 16 then return nil end
  return tonumber(text)
end

-- The bucket values of the key state `name` whose start lies in [lower, at], from its
-- `state` ({layout, text} as key_layout gives them; nil: read them), a dense hash's
-- roll-ups where it has them: a list, or nil and an error message.
local function window_values(name, lower, at, bucket_ms, state)
  local last = floor_to(at, bucket_ms)
  local values = {}
  local layout, text
  if state then layout, text = state.layout, state.text else layout, text = key_layout(name) end
  local hash, layout_width, sizes = dense_of(name), nil, nil
  if layout == "dense" then layout_width, sizes = rollup_layout(hash) end
  if layout_width and layout_width ~= bucket_ms then
    -- Read at another width, a key's roll-ups would not apply and its whole hash would be
    -- read: the caller names the data dir's width.
    return nil, "bucket ms " .. bucket_ms .. " is not this key's bucket width, " .. layout_width
  end
  if last < lower or layout == nil then
    -- no bucket: the key has none, or none can start in the window (only a negative
    -- window; rules have W > 0)
  elseif layout == "packed" then
    for field, value in packed_lines(text) do
      if is_bucket(field) then
        local start = tonumber(field)
        if start >= lower and start <= at then values[#values + 1] = value end
      end
    end
  elseif layout_width == bucket_ms then
    values = redis.call("HMGET", hash, unpack(cover(lower, last, bucket_ms, sizes)))
  elseif (last - lower) / bucket_ms < ROLLUP_MIN_BUCKETS then
    local names = {}
    for start = lower, last, bucket_ms do names[#names + 1] = ms_text(start) end
    values = redis.call("HMGET", hash, unpack(names))
  else -- a dense hash without roll-ups at this width: read whole
    local fields = redis.call("HGETALL", hash)
    for i = 1, #fields, 2 do
      if is_bucket(fields[i]) then
        local start = tonumber(fields[i])
        if start >= lower and start <= at then values[#values + 1] = fields[i + 1] end
      end
    end
  end
  return values
end

-- What `aggregator` needs of bucket values (HMGET's false for a missing one is skipped):
-- {count, value_count, sum, extreme, distinct (a set), distinct_count}. Each aggregator
-- reads only its part of each value (a lookup's time is these loops).
local function window_figures(values, aggregator)
  local count, value_count, sum, extreme, distinct, distinct_count = 0, 0, sum_new(), nil, {}, 0
  if aggregator == "SUM" or aggregator == "AVG" then
    for _, text in ipairs(values) do
      if text then
        local c, vc, int, frac = string.match(text, SUM_PART)
        count, value_count = count + c, value_count + vc
        if int ~= "" then sum_add_parts(sum, int, frac) end
      end
    end
  elseif aggregator == "MIN" or aggregator == "MAX" then
    local is_min = aggregator == "MIN"
    for _, text in ipairs(values) do
      if text then
        local c, v = string.match(text, is_min and MIN_PART or MAX_PART)
        count = count + c
        if v ~= "" and (extreme == nil or (is_min and dec_less(v, extreme))
                        or (not is_min and dec_less(extreme, v))) then
          extreme = v
        end
      end
    end
  elseif aggregator == "UNIQUE_COUNT" then
    for _, text in ipairs(values) do
      if text then
        local b = cjson.decode(text)
        count = count + b[1]
        for _, v in ipairs(b[6]) do
          if not distinct[v] then
            distinct[v] = true
            distinct_count = distinct_count + 1
          end
        end
      end
    end
  else
    for _, text in ipairs(values) do
      if text then count = count + string.match(text, COUNT_PART) end
    end
  end
  return {count = count, value_count = value_count, sum = sum, extreme = extreme,
          distinct = distinct, distinct_count = distinct_count}
end

-- The aggregate of `figures` as a decimal string, or nil when it has none (AVG rounded
-- half-even to 8 places, as velocity/domain/windows.py's format_aggregate).
local function aggregate_text(figures, aggregator)
  if aggregator == "COUNT" then
    return ms_text(figures.count)
  elseif aggregator == "UNIQUE_COUNT" then
    return ms_text(figures.distinct_count)
  elseif aggregator == "SUM" then
    return sum_total(figures.sum)
  elseif aggregator == "MIN" or aggregator == "MAX" then
    return figures.extreme and normalize(split(figures.extreme)) or nil
  elseif figures.sum.any and figures.value_count > 0 then
    return dec_div(sum_total(figures.sum), figures.value_count, 8)
  end
  return nil
end

-- FCALL velocity_window 1 <bucket hash> <aggregator> <window ms> <bucket ms> [at ms]
-- The aggregate of the buckets whose start lies in [floor_g(T - W), T], T = at or now.
-- Bad arguments get an error reply naming the argument; nothing is read.
local function velocity_window(keys, args)
  local aggregator = string.upper(args[1] or "")
  if not WINDOW_AGGREGATORS[aggregator] then
    return redis.error_reply("ERR velocity_window: aggregator '" .. tostring(args[1])
        .. "' is not one of COUNT, SUM, AVG, MIN, MAX, UNIQUE_COUNT")
  end
  local window_ms = whole_ms(args[2])
  if window_ms == nil or window_ms < 1 or window_ms > MAX_WINDOW_MS then
    return redis.error_reply("ERR velocity_window: window ms '" .. tostring(args[2])
        .. "' is not a whole number of 1 .. " .. MAX_WINDOW_MS .. " (366 days)")
  end
  local bucket_ms = whole_ms(args[3])
  if not BUCKET_WIDTHS_MS[bucket_ms] then
    return redis.error_reply("ERR velocity_window: bucket ms '" .. tostring(args[3])
        .. "' is not one of 1000, 2000, 5000, 10000, 15000, 20000, 30000, 60000")
  end
  local at = nil
  if args[4] ~= nil then
    at = whole_ms(args[4])
    if at == nil then
      return redis.error_reply("ERR velocity_window: at ms '" .. tostring(args[4])
          .. "' is not a whole number of epoch milliseconds")
    end
  else
    at = clock_ms()
  end
  local lower = floor_to(at - window_ms, bucket_ms)
  local values, problem = window_values(keys[1], lower, at, bucket_ms)
  if not values then return redis.error_reply("ERR velocity_window: " .. problem) end
  local figures = window_figures(values, aggregator)
  local value = aggregate_text(figures, aggregator)
  -- By hand: cjson.encode is a fifth of a short lookup's time.
  return '{"aggregateValue":' .. (value and ('"' .. value .. '"') or "null")
      .. ',"windowStart":' .. ms_text(lower) .. ',"windowEnd":' .. ms_text(at)
      .. ',"eventCount":' .. ms_text(figures.count) .. "}"
end

-- The pre-authorization check (SPEC §5a). The rules it evaluates are the hash
-- "<prefix>:rules" (velocity/redis/keys.py's check_rule), written with the rule entries
-- whenever the rules in force change: field = ruleId, value = the rule as the check reads
-- it; field CHECK_PROGRESS_FIELD = the name of the stream's progress hash.
local CHECK_PROGRESS_FIELD = "~progress"
-- field CHECK_MAX_FUTURE_FIELD = VELOCITY_MAX_FUTURE_SECONDS in ms: a payment dated further
-- ahead of the clock, or of the newest payment committed, the stream quarantines.
local CHECK_MAX_FUTURE_FIELD = "~maxFutureMs"
-- An event's fields (velocity/domain/schema.py's EVENT_FIELDS): those a check requires, and
-- the declared ones rules may read. Anything else is accepted and ignored, as the stream
-- ignores it.
local CHECK_REQUIRED = {"transactionId", "eventTime", "payerId", "beneficiaryId",
                        "paymentAmount", "paymentType"}
local CHECK_DECLARED = {transactionId = true, eventTime = true, payerId = true,
                        beneficiaryId = true, paymentAmount = true, paymentType = true,
                        ip = true, deviceId = true, action = true}
local PAYMENT_TYPES = {CSH = true, CRD = true}
-- So that no call's work grows with its arguments: at most this many fields, each value at
-- most this long (a key's name is made of them).
local CHECK_MAX_FIELDS = 32
local CHECK_MAX_VALUE_BYTES = 1024
local AMOUNT_MAX_PLACES = 8
local AMOUNT_MAX_WHOLE_DIGITS = 18 -- amounts are below 10^18
local OUTCOME_STRENGTH = {ALERT = 0, REVIEW = 1, BLOCK = 2}
local DECISIONS = {[0] = "ALLOW", [1] = "REVIEW", [2] = "BLOCK"}

-- `text` as a JSON string exactly as Python's json.dumps(text, ensure_ascii=False) writes
-- it (cjson would escape "/"): a key's name is made of its values so.
local JSON_ESCAPES = {['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
                      ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t"}
local function json_string(text)
  return '"' .. string.gsub(text, '[%c"\\]', function(c)
    if c == "\127" then return c end -- DEL is no control character to JSON
    return JSON_ESCAPES[c] or string.format("\\u%04x", string.byte(c))
  end) .. '"'
end

local function check_error(field, reason)
  return redis.error_reply("ERR velocity_check: " .. field .. " " .. reason)
end

-- The payment from `args` (field value ...): a table of canonical values (the amount
-- normalized), or nil and an error reply naming the field.
local function check_event(args)
  if #args % 2 == 1 then
    return nil, check_error("arguments", "must be field value pairs; got an odd number")
  end
  if #args > 2 * CHECK_MAX_FIELDS then
    return nil, check_error("arguments", "name more than " .. CHECK_MAX_FIELDS .. " fields")
  end
  local event = {}
  for i = 1, #args, 2 do
    local name, value = args[i], args[i + 1]
    if event[name] ~= nil then return nil, check_error(name, "is given twice") end
    if #value > CHECK_MAX_VALUE_BYTES then
      return nil, check_error(name, "is longer than " .. CHECK_MAX_VALUE_BYTES .. " bytes")
    end
    -- Blank counts as missing (SPEC §1), as the stream reads it.
    if string.find(value, "^%s*$") == nil then event[name] = value end
  end
  for _, name in ipairs(CHECK_REQUIRED) do
    if event[name] == nil then return nil, check_error(name, "is required") end
  end
  for name in pairs(event) do
    if not CHECK_DECLARED[name] then event[name] = nil end
  end
  local t = whole_ms(event.eventTime)
  if t == nil then
    return nil, check_error("eventTime", "'" .. event.eventTime
        .. "' is not a whole number of epoch milliseconds (at most 16 digits)")
  end
  event.time = t
  local sign, int, frac = string.match(event.paymentAmount, "^%s*([+]?)(%d*)%.?(%d*)%s*$")
  if int == nil or (int == "" and frac == "") then
    return nil, check_error("paymentAmount", "'" .. event.paymentAmount
        .. "' is not a plain decimal number like 120.50")
  end
  frac = string.gsub(frac, "0+$", "")
  if #frac > AMOUNT_MAX_PLACES then
    return nil, check_error("paymentAmount", "'" .. event.paymentAmount
        .. "' has more than " .. AMOUNT_MAX_PLACES .. " decimal places")
  end
  local amount = normalize(int == "" and "0" or int, frac)
  if #string.match(amount, "^%d+") > AMOUNT_MAX_WHOLE_DIGITS then
    return nil, check_error("paymentAmount", "'" .. event.paymentAmount
        .. "' is outside 0 <= amount < 10^18")
  end
  event.paymentAmount = amount
  if not PAYMENT_TYPES[event.paymentType] then
    return nil, check_error("paymentType", "'" .. event.paymentType .. "' is not one of CRD, CSH")
  end
  return event
end

-- a × n for a non-negative decimal string and a whole number n >= 1 (below 10^14).
local function dec_mul(a, n)
  local int, frac = split(a)
  local digits, out, carry = int .. frac, {}, 0
  for k = #digits, 1, -1 do
    local d = (string.byte(digits, k) - 48) * n + carry
    out[k] = d % 10
    carry = (d - d % 10) / 10
  end
  local text = table.concat(out)
  if carry > 0 then text = string.format("%d", carry) .. text end
  return normalize(string.sub(text, 1, #text - #frac), string.sub(text, #text - #frac + 1))
end

-- -1, 0 or 1 as value <, =, > limit: value a non-negative decimal string, limit any
-- decimal string (a limit may be negative).
local function limit_cmp(value, limit)
  if string.sub(limit, 1, 1) == "-" then return 1 end -- format_decimal writes no "-0"
  return dec_cmp(value, limit)
end

local OPERATORS = {
  ["="] = function(c) return c == 0 end, ["!="] = function(c) return c ~= 0 end,
  [">="] = function(c) return c >= 0 end, ["<="] = function(c) return c <= 0 end,
  [">"] = function(c) return c > 0 end, ["<"] = function(c) return c < 0 end,
}

-- A rule of "<prefix>:rules" decoded, with its filter as sets; kept per text while the
-- library is loaded (rules change rarely; the cache is dropped when it grows large).
local check_rules, check_rules_count = {}, 0

local function check_rule(text)
  local rule = check_rules[text]
  if rule then return rule end
  rule = cjson.decode(text)
  rule.filter_sets = {}
  for _, pair in ipairs(rule.filter) do
    local set = {}
    for _, v in ipairs(pair[2]) do set[v] = true end
    rule.filter_sets[#rule.filter_sets + 1] = {pair[1], set}
  end
  if check_rules_count >= 10000 then check_rules, check_rules_count = {}, 0 end
  check_rules[text], check_rules_count = rule, check_rules_count + 1
  return rule
end

-- The window figures of `rule` for the payment `event` as the next event of its key: the
-- key state's buckets in [floor_g(t - W), t] plus the payment itself.
local function payment_window(rule, event, state)
  local lower = floor_to(event.time - rule.windowMs, rule.bucketMs)
  local values, problem = window_values(state.name, lower, event.time, rule.bucketMs, state)
  if not values then return nil, lower, problem end
  local aggregator = rule.aggregatorFunctionType
  local figures = window_figures(values, aggregator)
  figures.count = figures.count + 1
  local field = rule.aggregateFieldName
  local value = field ~= cjson.null and field and event[field] or nil
  if aggregator ~= "COUNT" and value ~= nil then
    figures.value_count = figures.value_count + 1
    if aggregator == "SUM" or aggregator == "AVG" then
      sum_add(figures.sum, value)
    elseif aggregator == "MIN" then
      if figures.extreme == nil or dec_less(value, figures.extreme) then figures.extreme = value end
    elseif aggregator == "MAX" then
      if figures.extreme == nil or dec_less(figures.extreme, value) then figures.extreme = value end
    elseif not figures.distinct[value] then
      figures.distinct[value] = true
      figures.distinct_count = figures.distinct_count + 1
    end
  end
  return figures, lower
end

-- Whether `figures` fire `rule`, and the aggregate as text (nil: none). AVG is judged as
-- total OP limit × count, exactly, as velocity/domain/windows.py's fired_value.
local function check_fires(rule, figures)
  local aggregator, holds = rule.aggregatorFunctionType, OPERATORS[rule.limitOperatorType]
  local value = aggregate_text(figures, aggregator)
  if value == nil then return false, nil end
  if aggregator == "AVG" then
    local limit = rule.limit
    local total = sum_total(figures.sum)
    if string.sub(limit, 1, 1) == "-" then return holds(1), value end
    return holds(dec_cmp(total, dec_mul(limit, figures.value_count))), value
  end
  return holds(limit_cmp(value, rule.limit)), value
end

-- The state of one (signature, key), read once per call: its layout, text, and a packed
-- key's fields.
local function check_state(name)
  local layout, text = key_layout(name)
  return {name = name, layout = layout, text = text}
end

-- Whether a firing of `rule` at `event` would be notified (SPEC §3 cooldown) as the next
-- alert of its key: the key's last notified alert of the rule version is none, or at least
-- the cooldown before it.
local function check_notified(rule, event, state)
  local field, last = "n:" .. ms_text(rule.ruleId) .. ":" .. ms_text(rule.ruleVersion), nil
  if state.layout == "packed" then
    -- Parsed once a key, however many of its rules have a cooldown.
    state.fields = state.fields or packed_fields(state.text)
    last = state.fields[field]
  elseif state.layout == "dense" then
    last = redis.call("HGET", dense_of(state.name), field)
  end
  if not last then return true end
  local last_time = tonumber(string.match(last, "^%[(%d+),"))
  return event.time >= last_time + rule.cooldownMs
end

-- Redis Cluster's key slot of a name: CRC16 (XMODEM) of its hash tag (the text between the
-- first "{" and the next "}", when not empty), modulo 16384; as the server computes it.
-- Built at the first call: a library's loading code may not use the bit library.
local CRC16_TABLE = nil

local function crc16_table()
  local crcs = {}
  for i = 0, 255 do
    local crc = bit.lshift(i, 8)
    for _ = 1, 8 do
      if bit.band(crc, 0x8000) ~= 0 then
        crc = bit.bxor(bit.lshift(crc, 1), 0x1021)
      else
        crc = bit.lshift(crc, 1)
      end
    end
    crcs[i] = bit.band(crc, 0xFFFF)
  end
  return crcs
end

local function key_slot(name)
  CRC16_TABLE = CRC16_TABLE or crc16_table()
  local open = string.find(name, "{", 1, true)
  if open then
    local close = string.find(name, "}", open + 1, true)
    if close and close > open + 1 then name = string.sub(name, open + 1, close - 1) end
  end
  local crc = 0
  for k = 1, #name do
    local index = bit.band(bit.bxor(bit.rshift(crc, 8), string.byte(name, k)), 0xFF)
    crc = bit.band(bit.bxor(bit.lshift(crc, 8), CRC16_TABLE[index]), 0xFFFF)
  end
  return crc % 16384
end

-- The slot ranges "lo-hi,lo-hi,…" a master serves (CHECK_SLOTS_FIELD's value): a list of
-- {lo, hi}, or nil when malformed. At most 64 ranges.
local CHECK_SLOTS_FIELD = "~slots"
local function slot_ranges(text)
  local ranges = {}
  for lo, hi in string.gmatch(text, "(%d+)%-(%d+)") do
    ranges[#ranges + 1] = {tonumber(lo), tonumber(hi)}
    if #ranges > 64 then return nil end
  end
  if #ranges == 0 then return nil end
  return ranges
end

local function is_local(name, ranges)
  if not ranges then return true end
  local slot = key_slot(name)
  for _, range in ipairs(ranges) do
    if slot >= range[1] and slot <= range[2] then return true end
  end
  return false
end

-- FCALL_RO velocity_check 1 <prefix>:rules <field> <value> [<field> <value> ...]
-- (on a Redis Cluster: 1 <prefix>:rules:{<tag>} — the copy on the master called — and a
-- pair CHECK_SLOTS_FIELD "<the master's slot ranges>" among the payment's; see
-- velocity/redis/check.py)
-- Which ACTIVE rules in force the payment would fire now (SPEC §5a): each rule whose filter
-- it passes, evaluated as the stream would decide it as the next event of its key, from the
-- buckets Redis holds plus the payment; nothing is written. Values as canonical strings
-- (the amount a plain decimal). A bad field gets an error reply naming it.
-- reply: {"decision", "rules": [{ruleId, ruleVersion, outcome, key, fired, aggregateValue,
--   limitOperatorType, limit, windowStart, windowEnd[, notified]}], "stateAsOf"}
-- Why the stream would quarantine a payment dated `t` as future_event_time (more than
-- `max_future` ms ahead of the clock, or of `newest`, the newest eventTime it has
-- committed, when known), or nil.
local function future_problem(t, max_future, newest)
  local clock = clock_ms()
  local seconds = ms_text(max_future / 1000)
  local suffix = ": the stream would quarantine it (future_event_time), so it is not checked"
  if t > clock + max_future then
    return "'" .. ms_text(t) .. "' is more than " .. seconds .. " s ahead of the clock" .. suffix
  end
  if newest and t > newest + max_future then
    return "'" .. ms_text(t) .. "' is more than " .. seconds .. " s ahead of the newest "
        .. "payment committed (" .. ms_text(newest) .. ")" .. suffix
  end
  return nil
end

local function velocity_check(keys, args)
  -- On a Redis Cluster each master evaluates the rules whose key it serves: the caller
  -- names its slots (a field CHECK_SLOTS_FIELD among the payment's) and merges the answers.
  local ranges, slots_at = nil, nil
  for i = 1, #args - 1, 2 do
    if args[i] == CHECK_SLOTS_FIELD then slots_at = i end
  end
  if slots_at then
    ranges = slot_ranges(args[slots_at + 1])
    if not ranges then return check_error(CHECK_SLOTS_FIELD, "is not slot ranges lo-hi,lo-hi") end
    table.remove(args, slots_at + 1)
    table.remove(args, slots_at)
  end
  local event, problem = check_event(args)
  if not event then return problem end
  -- "<prefix>:rules", or on a Redis Cluster a master's copy "<prefix>:rules:{<tag>}"
  local prefix = string.match(keys[1], "^(.*):rules$") or string.match(keys[1], "^(.*):rules:{[^}]*}$")
  if not prefix then return check_error("key", "'" .. keys[1] .. "' is not <prefix>:rules") end
  local entries = redis.call("HGETALL", keys[1])
  if #entries == 0 then
    -- Not "no rule fired": the rules are not there (Redis emptied, the stream not started
    -- since, or another prefix). The stream writes the hash even with no rule in force.
    return redis.error_reply("ERR velocity_check unavailable: " .. keys[1] .. " holds no "
        .. "rules: the stream has not published them since Redis was emptied, or the prefix "
        .. "is not a data dir's")
  end
  local progress_name, max_future, texts = nil, nil, {}
  for i = 1, #entries, 2 do
    if entries[i] == CHECK_PROGRESS_FIELD then
      progress_name = entries[i + 1]
    elseif entries[i] == CHECK_MAX_FUTURE_FIELD then
      max_future = tonumber(entries[i + 1])
    else
      texts[#texts + 1] = entries[i + 1]
    end
  end
  -- The stream's progress, read once: the answer's stateAsOf, and the bound of a payment
  -- dated in the future.
  local newest, at, batch = "null", "null", "null"
  if progress_name and is_local(progress_name, ranges) then
    local p = redis.call("HMGET", progress_name, "newest", "at", "batch")
    -- A progress field is digits, or empty (a stream started, nothing committed yet): null.
    local function number_or_null(v) return (v and string.match(v, "^%d+$")) and v or "null" end
    newest, at, batch = number_or_null(p[1]), number_or_null(p[2]), number_or_null(p[3])
  end
  if max_future then
    local ahead = future_problem(event.time, max_future, tonumber(newest))
    if ahead then return check_error("eventTime", ahead) end
  end
  local rules = {}
  for _, text in ipairs(texts) do rules[#rules + 1] = check_rule(text) end
  table.sort(rules, function(a, b) return a.ruleId < b.ruleId end)
  local states, decided, strongest = {}, {}, 0
  for _, rule in ipairs(rules) do
    local passes = true
    for _, pair in ipairs(rule.filter_sets) do
      local v = event[pair[1]]
      if v == nil or not pair[2][v] then passes = false break end
    end
    local key_values, key_texts = {}, {}
    for k, name in ipairs(rule.groupingKeyNames) do
      if event[name] == nil then passes = false break end
      key_values[k] = json_string(event[name])
      key_texts[k] = json_string(name) .. ":" .. key_values[k]
    end
    local name = passes and (prefix .. ":{" .. rule.signatureId .. ":["
        .. table.concat(key_values, ",") .. "]}:buckets")
    if passes and is_local(name, ranges) then
      local state = states[name]
      if not state then
        state = check_state(name)
        states[name] = state
      end
      local figures, lower, trouble = payment_window(rule, event, state)
      if not figures then return redis.error_reply("ERR velocity_check: " .. trouble) end
      local fired, value = check_fires(rule, figures)
      local line = '{"ruleId":' .. ms_text(rule.ruleId) .. ',"ruleVersion":'
          .. ms_text(rule.ruleVersion) .. ',"outcome":"' .. rule.outcome .. '","key":{'
          .. table.concat(key_texts, ",") .. '},"fired":' .. tostring(fired)
          .. ',"aggregateValue":' .. (value and ('"' .. value .. '"') or "null")
          .. ',"limitOperatorType":"' .. rule.limitOperatorType .. '","limit":"' .. rule.limit
          .. '","windowStart":' .. ms_text(lower) .. ',"windowEnd":' .. ms_text(event.time)
      if rule.cooldownMs > 0 and fired then
        line = line .. ',"notified":' .. tostring(check_notified(rule, event, state))
      end
      decided[#decided + 1] = line .. "}"
      if fired and OUTCOME_STRENGTH[rule.outcome] > strongest then
        strongest = OUTCOME_STRENGTH[rule.outcome]
      end
    end
  end
  return '{"decision":"' .. DECISIONS[strongest] .. '","rules":[' .. table.concat(decided, ",")
      .. '],"stateAsOf":{"eventTime":' .. newest .. ',"committedAt":' .. at
      .. ',"batch":' .. batch .. "}}"
end

-- FCALL velocity_evict 1 <bucket hash> <cutoff ms>
-- Drops the buckets that start before the cutoff; returns how many were dropped.
local function velocity_evict(keys, args)
  local layout, text = key_layout(keys[1])
  if layout == "packed" then
    local fields = packed_fields(text, true)
    local count = drop_fields_before(fields, tonumber(args[1]))
    if count > 0 then store_fields(keys[1], fields, nil, "") end
    return count
  end
  if layout == nil then return 0 end
  local dropped, hash = {}, dense_of(keys[1])
  local count = drop_before(hash, tonumber(args[1]), dropped)
  if count > 0 then after_bucket_writes(hash, dropped, nil) end
  if redis.call("EXISTS", hash) == 0 then redis.call("DEL", keys[1]) end
  return count
end

-- FCALL velocity_put_buckets 1 <bucket hash> <bucket ms> <ttl ms> <drop before ms>
--   [<start> <value>]...
-- Sets buckets (or other fields: a rule's last notified alert) to absolute values (an
-- empty value removes the field), drops the buckets
-- that start before <drop before> (unless empty), keeps the roll-ups in step, and gives
-- the hash the TTL (unless empty). Returns the buckets set.
local function velocity_put_buckets(keys, args)
  local layout, text = key_layout(keys[1])
  if layout ~= "dense" then -- packed (or new): rewritten whole, dense once it has enough
    local fields, set = packed_fields(text, true), 0
    for i = 4, #args - 1, 2 do
      if args[i + 1] == "" then
        fields[args[i]] = nil
      else
        fields[args[i]] = args[i + 1]
        set = set + 1
      end
    end
    if args[3] ~= "" then drop_fields_before(fields, tonumber(args[3])) end
    store_fields(keys[1], fields, tonumber(args[1]), args[2])
    return set
  end
  local hash, touched, set = dense_of(keys[1]), {}, 0
  for i = 4, #args - 1, 2 do
    if args[i + 1] == "" then
      redis.call("HDEL", hash, args[i])
    else
      redis.call("HSET", hash, args[i], args[i + 1])
      set = set + 1
    end
    if is_bucket(args[i]) then touched[tonumber(args[i])] = true end
  end
  if args[3] ~= "" then drop_before(hash, tonumber(args[3]), touched) end
  after_bucket_writes(hash, touched, tonumber(args[1]))
  if redis.call("EXISTS", hash) == 0 then
    redis.call("DEL", keys[1]) -- its last field gone
  elseif args[2] ~= "" then
    redis.call("PEXPIRE", hash, args[2])
    redis.call("PEXPIRE", keys[1], args[2])
  end
  return set
end

-- How an alert stream is trimmed as it grows, from its retention (the setting
-- VELOCITY_REDIS_ALERT_STREAM_RETENTION): "<count>" keeps about that many entries (MAXLEN ~),
-- "age:<ms>" those of the last ms milliseconds (MINID ~ the id of now - ms). XADD's
-- arguments before the entry's id.
local function alert_trim(retention)
  local age = string.match(retention, "^age:(%d+)$")
  if age then
    return "MINID", ms_text(math.max(0, clock_ms() - tonumber(age)))
  end
  return "MAXLEN", retention
end

-- FCALL velocity_publish_backfill 1 <alert stream> <retention> <alert json> ...
-- Appends a backfill's corrections and retractions. Each entry repeats the batch of the
-- stream's last entry (a consumer reading by batch sees it after that batch).
local function velocity_publish_backfill(keys, args)
  local trim, bound = alert_trim(args[1])
  local batch = "-1"
  local last = redis.call("XREVRANGE", keys[1], "+", "-", "COUNT", 1)
  if #last > 0 then
    local entry = last[1][2]
    for i = 1, #entry, 2 do
      if entry[i] == "batch" then batch = entry[i + 1] end
    end
  end
  for i = 2, #args do
    redis.call("XADD", keys[1], trim, "~", bound, "*", "alert", args[i], "batch", batch,
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

-- Every bucket, raw-events and last-notified field of the named keys (roll-ups left out),
-- as one packed text a name, in the names' order, joined by "\030" (a control character,
-- escaped in every JSON value): a packed key's text as it is stored, a dense key's hash's
-- fields after the DENSE_TEXT line, "" for a key that has none. A GET each: a command's
-- keys must share a slot on a Redis Cluster. (The stream reads its keys' states with a
-- plain MGET and only its dense keys here: Lua's copy of every value cost Redis more.)
local KEY_SEPARATOR = "\030"

local function read_keys(names)
  local texts = {}
  for k, name in ipairs(names) do
    local value = redis.call("GET", name)
    if value == DENSE_TEXT then
      value = DENSE_TEXT .. packed_text(state_fields(dense_of(name)))
    end
    texts[k] = value or ""
  end
  return table.concat(texts, KEY_SEPARATOR)
end

-- The accepted transactionIds, de-duplicated over a horizon h: the hash "<seen prefix><n>"
-- holds those accepted in the n-th span of h since the epoch (field = transactionId, value
-- = the batch), and expires when the span after it ends, so an id is remembered for h to
-- 2h. A batch's ids cost one HSET (and a lookup one HMGET a span), not a key each.
local function seen_span(horizon_ms)
  return math.floor(clock_ms() / horizon_ms)
end

-- The 1-based indices of the transactionIds `ids` accepted within the horizon, ascending.
local function seen_indices(prefix, horizon_ms, ids)
  local span, found = seen_span(horizon_ms), {}
  for _, n in ipairs({span, span - 1}) do
    local name = prefix .. string.format("%d", n)
    for first = 1, #ids, 2000 do
      local values = redis.call("HMGET", name, unpack(ids, first, math.min(first + 1999, #ids)))
      for j, value in ipairs(values) do
        if value then found[first + j - 1] = true end
      end
    end
  end
  local out = {}
  for i in pairs(found) do out[#out + 1] = i end
  table.sort(out)
  return out
end

-- FCALL velocity_stream_read 3 <progress hash> <buckets epoch> <mirror marker> <request json>
-- The read half of a micro-batch, in one call: the stream's progress (last committed
-- batch, newest eventTime), the buckets epoch, the mirror marker and which of the named
-- transactionIds were accepted within the horizon. (The keys' states: an MGET beside it.)
-- request = {"s": [transactionId, ...], "sp": seen prefix, "sh": de-duplication horizon ms}
-- reply = {"p": {field: value}, "e": epoch, "m": marker, "s": [1-based indices seen]}
local function velocity_stream_read(keys, args)
  local request = cjson.decode(args[1])
  local progress = {}
  local fields = redis.call("HGETALL", keys[1])
  for i = 1, #fields, 2 do progress[fields[i]] = fields[i + 1] end
  return cjson.encode({
    p = progress,
    e = redis.call("GET", keys[2]) or "0",
    m = redis.call("GET", keys[3]) or "",
    s = seen_indices(request["sp"], tonumber(request["sh"]), request["s"]),
  })
end

-- Remembers the accepted transactionIds `ids[first..last]` (see seen_indices) as accepted
-- by `batch`.
local function remember_seen(prefix, horizon_ms, ids, first, last, batch)
  if last < first then return end
  local span = seen_span(horizon_ms)
  local name = prefix .. string.format("%d", span)
  local fields = {}
  for i = first, last do
    fields[#fields + 1] = ids[i]
    fields[#fields + 1] = batch
  end
  in_slices("HSET", name, fields)
  redis.call("PEXPIREAT", name, string.format("%d", (span + 2) * horizon_ms))
end

-- A packed key's state whole: `moved` "0" (its TTL kept), "1" (its newest bucket moved: the
-- TTL starts again) or "2" (it was dense: its hash goes).
local function set_packed(state, value, moved, ttl_ms)
  if moved == "2" then redis.call("DEL", dense_of(state)) end
  if value == "" then
    redis.call("DEL", state)
  elseif moved ~= "0" or not redis.call("SET", state, value, "XX", "KEEPTTL") then
    redis.call("SET", state, value, "PX", ttl_ms)
  end
end

local PACKED_ONLY = {p0 = "0", p1 = "1", p2 = "2"}
local PACKED = {q0 = "0", q1 = "1", q2 = "2"}

-- A micro-batch's bucket changes: `count` runs of plain arguments from args[first] on,
-- one per changed (signature, key) (velocity/redis/commit_args.py's KeyChange), by kind:
--   state "p<moved>" value                        a packed key whole, one SET (set_packed)
--   base "q<moved>" value                         the same, then its raw events' changes
--   base "f" n_fields (field value)...            the key whole, dense from now on
--   base "0" n_sets n_fields (start value)... (field value)... n_drops start...
--                                                 a dense key's changes
-- all but "p" followed by n_removed start... n_appended (start fragment)...: the raw events
-- no longer kept (in their own strings) and those appended to. A packed key's TTL moves only
-- with its newest bucket, else it keeps its own. A dense key's run holds its
-- buckets' absolute values and the fields beside them (the raw events of buckets new to
-- it, "~<start>", and its rules' last notified alerts, "n:<rule>:<version>"); Redis keeps
-- its roll-ups in step. Nothing to decode: the arguments are used where they lie.
-- Returns the index after the runs.
local function apply_bucket_changes(args, first, count, ttl_ms, bucket_ms)
  local i = first
  for _ = 1, count do
    local kind = args[i + 1]
    local moved = PACKED_ONLY[kind]
    if moved then -- nearly every key: three arguments, one SET
      set_packed(args[i], args[i + 2], moved, ttl_ms)
      i = i + 3
    else
      local base = args[i]
      local state, hash = base .. ":buckets", base .. ":dense"
      moved = PACKED[kind]
      local whole = moved or kind == "f"
      local sets_at, n_sets, drops_at, n_drops = 0, 0, 0, 0
      if moved then
        set_packed(state, args[i + 2], moved, ttl_ms)
        i = i + 3
      elseif kind == "f" then
        local fields_at = i + 3
        i = fields_at + 2 * tonumber(args[i + 2])
        store_dense(state, args, fields_at, i - 1, bucket_ms, ttl_ms)
      else
        n_sets = tonumber(args[i + 2])
        local n_fields = tonumber(args[i + 3])
        sets_at = i + 4
        i = sets_at + 2 * (n_sets + n_fields)
        -- The buckets and the fields beside them in one HSET.
        if i > sets_at then
          in_slices("HSET", hash, args, sets_at, i - 1)
          redis.call("PEXPIRE", hash, ttl_ms)
          redis.call("SET", state, DENSE_TEXT, "PX", ttl_ms)
        end
        n_drops = tonumber(args[i])
        drops_at = i + 1
        i = drops_at + n_drops
      end
      local n_removed = tonumber(args[i])
      local removed_at = i + 1
      local n_appended = tonumber(args[removed_at + n_removed])
      local appended_at = removed_at + n_removed + 1
      i = appended_at + 2 * n_appended
      -- Dropped buckets, and raw events no longer kept (in the hash or in their string).
      if n_drops + n_removed > 0 then
        local gone = {}
        for j = drops_at, drops_at + n_drops - 1 do gone[#gone + 1] = args[j] end
        for j = removed_at, removed_at + n_removed - 1 do
          gone[#gone + 1] = "~" .. args[j]
          redis.call("DEL", base .. ":raw:" .. args[j])
        end
        if not whole then in_slices("HDEL", hash, gone) end
      end
      -- Raw events added to: the first time, those in a dense key's hash move to a string of
      -- their own ("<base>:raw:<start>", the buckets' TTL), which later batches append to. A
      -- whole key's run has moved them already (its fragment starts with them).
      for j = appended_at, i - 1, 2 do
        local field, name = "~" .. args[j], base .. ":raw:" .. args[j]
        local kept = not whole and redis.call("HGET", hash, field)
        if kept then
          redis.call("SET", name, kept .. args[j + 1], "PX", ttl_ms)
          redis.call("HDEL", hash, field)
        else
          redis.call("APPEND", name, args[j + 1])
          redis.call("PEXPIRE", name, ttl_ms)
        end
      end
      -- Roll-ups of a dense key's changes. One that only grew and has fewer than
      -- ROLLUP_KEEP_FIELDS fields has none (one HLEN); the others are refreshed at the
      -- starts touched.
      local grew = n_drops == 0
      if not whole and n_sets + n_drops > 0
          and not (grew and redis.call("HLEN", hash) < ROLLUP_KEEP_FIELDS) then
        if redis.call("HEXISTS", hash, ROLLUP_FLAG) == 1 then
          local starts = {}
          for j = sets_at, sets_at + 2 * n_sets - 1, 2 do starts[tonumber(args[j])] = true end
          for j = drops_at, drops_at + n_drops - 1 do starts[tonumber(args[j])] = true end
          after_bucket_writes(hash, starts, bucket_ms)
        elseif grew and redis.call("HLEN", hash) >= ROLLUP_MIN_BUCKETS then
          after_bucket_writes(hash, {}, bucket_ms) -- has just become dense: built whole
        end
      end
    end
  end
  return i
end

-- A micro-batch's write is refused: -2 when the state lock `lock` does not hold the caller's
-- `token` (its lease ran out: someone else may be writing), -1 when the progress hash says
-- `batch` is committed already (a replay); nil when it may go ahead.
local function refused_write(progress, lock, token, batch)
  if not held_by(redis.call("GET", lock), token) then return -2 end
  local last = redis.call("HGET", progress, "batch")
  if last and tonumber(last) >= tonumber(batch) then return -1 end
  return nil
end

-- XADDs args[first .. #args - 1] as alerts of `batch`: the last args[#args] of them (the
-- shadow rules') on `shadow`, the others on `stream`. How many went on `stream`.
local function publish_alerts(stream, shadow, args, first, retention, batch)
  local shadow_at, trim, bound = #args - tonumber(args[#args]), alert_trim(retention)
  for i = first, shadow_at - 1 do
    redis.call("XADD", stream, trim, "~", bound, "*", "alert", args[i], "batch", batch)
  end
  for i = shadow_at, #args - 1 do
    redis.call("XADD", shadow, trim, "~", bound, "*", "alert", args[i], "batch", batch)
  end
  return shadow_at - first
end

-- FCALL velocity_stream_commit 4 <progress hash> <alert stream> <state lock>
--   <shadow alert stream> <lock token> <batch> <newest eventTime> <bucket ttl ms>
--   <seen ttl ms> <alert retention> <bucket ms> <seen prefix> <keys changed>
--   <transactionIds accepted> <each changed key's run>... <transactionId>...
--   <alert json>... <shadow alert json>... <shadow alerts>
-- The write half of a micro-batch, atomic: every changed bucket's absolute value (and its
-- hash's TTL and roll-ups), the buckets dropped below the horizon, the accepted
-- transactionIds, the alerts on the stream (a shadow rule's on the shadow stream, never
-- on the one downstream services read), and the progress (with "at", the time of this
-- commit). Fenced: unless the state lock holds the caller's token (its lease ran out,
-- someone else may be writing) nothing is written and -2 returned. A batch not newer than
-- the progress was committed already: nothing is written and -1 returned (a replay
-- changes nothing twice). A key's run: see apply_bucket_changes.
local function velocity_stream_commit(keys, args)
  local refused = refused_write(keys[1], keys[3], args[1], args[2])
  if refused then return refused end
  local ids_at = apply_bucket_changes(args, 11, tonumber(args[9]), args[4], tonumber(args[7]))
  local alerts_at = ids_at + tonumber(args[10])
  remember_seen(args[8], tonumber(args[5]), args, ids_at, alerts_at - 1, args[2])
  local published = publish_alerts(keys[2], keys[4], args, alerts_at, args[6], args[2])
  redis.call("HSET", keys[1], "batch", args[2], "newest", args[3], "at", ms_text(clock_ms()),
             "layout", STATE_LAYOUT)
  return published
end

-- A micro-batch with many alerts publishes them ahead of its commit in pieces of about a
-- hundred, each a call of well under a millisecond (450 alerts held Redis 3-5 ms in the
-- commit's one call, and checks waited behind it); the commit publishes the last piece.
-- "<progress hash>:alert-pieces" = "<batch>/<pieces published>" says how far a batch got,
-- so that a replay after a crash between pieces publishes none twice.
local ALERT_PIECES_SUFFIX = ":alert-pieces"

-- FCALL velocity_stream_alerts 4 <progress hash> <alert stream> <state lock>
--   <shadow alert stream> <lock token> <batch> <piece> <alert retention> <alert json>...
--   <shadow alert json>... <shadow alerts>
-- Piece <piece> (1, 2, ...) of a micro-batch's alerts, in turn. Fenced (-2) and refused
-- once the batch is committed (-1) as velocity_stream_commit; 0 when this piece of the
-- batch was published before (a replay: nothing goes out twice); an error when the piece
-- before it was not; else the alerts published.
local function velocity_stream_alerts(keys, args)
  local refused = refused_write(keys[1], keys[3], args[1], args[2])
  if refused then return refused end
  local record = keys[1] .. ALERT_PIECES_SUFFIX
  local batch, piece = string.match(redis.call("GET", record) or "", "^(%d+)/(%d+)$")
  local published = batch == args[2] and tonumber(piece) or 0
  piece = tonumber(args[3])
  if piece <= published then return 0 end
  if piece ~= published + 1 then
    return redis.error_reply("ERR velocity_stream_alerts: piece " .. piece .. " of batch "
        .. args[2] .. " before piece " .. (published + 1))
  end
  local count = publish_alerts(keys[2], keys[4], args, 5, args[4], args[2])
  redis.call("SET", record, args[2] .. "/" .. piece)
  return count
end

-- FCALL velocity_batch_plan 2 <state lock> <plan key> <lock token> <batch> <plan json>
-- How a micro-batch is cut into key-partitions and what it is decided with: the plan
-- recorded for this batch, if any (a replay after a crash must cut and decide as the first
-- attempt did, or a partition's record would stand for other keys), else `plan json`,
-- recorded now. The plan's "batch" is text. Fenced: -2, nothing written.
local function velocity_batch_plan(keys, args)
  if not held_by(redis.call("GET", keys[1]), args[1]) then return -2 end
  local recorded = redis.call("GET", keys[2])
  if recorded then
    local ok, plan = pcall(cjson.decode, recorded)
    if ok and type(plan) == "table" and plan["batch"] == args[2] then return recorded end
  end
  redis.call("SET", keys[2], args[3])
  return args[3]
end

-- A key-partition of many keys is committed in pieces, each a call of a millisecond or so
-- (checks and lookups wait behind a call, and a partition of 3,000 keys held Redis 20-40
-- ms): the first piece records the outcome, the others follow. Beside the record, the
-- string "<record>:pieces" = "<applied>/<pieces>" says how far its changes are applied.
local PIECES_SUFFIX = ":pieces"

-- FCALL velocity_partition_commit 3 <progress hash> <state lock> <partition record>
--   <lock token> <batch> <record ttl ms> <bucket ttl ms> <bucket ms> <keys changed>
--   <pieces> <outcome> <each changed key's run>...
-- One key-partition of a micro-batch, idempotent on (batch, partition): its bucket changes
-- (runs as velocity_stream_commit's) of its first piece and its record holding `outcome`
-- (what its task returns: its alerts and Delta rows), atomically; with more than one piece
-- the rest follow in velocity_partition_piece. Fenced (-2) and refused once the batch is
-- committed (-1) as velocity_stream_commit. When the record is there already (a retried
-- or speculative task, a replayed batch) nothing is applied and {recorded outcome} is
-- returned: a partition's first decisions are the ones that count. 0 when applied. On a
-- Redis Cluster the runs are none and the outcome holds each master's changes, applied
-- next by velocity_cluster_apply.
local function velocity_partition_commit(keys, args)
  local refused = refused_write(keys[1], keys[2], args[1], args[2])
  if refused then return refused end
  local recorded = redis.call("GET", keys[3])
  if recorded then return {recorded} end
  apply_bucket_changes(args, 9, tonumber(args[6]), args[4], tonumber(args[5]))
  redis.call("SET", keys[3], args[8], "PX", args[3])
  if args[7] ~= "1" then
    redis.call("SET", keys[3] .. PIECES_SUFFIX, "1/" .. args[7], "PX", args[3])
  end
  return 0
end

-- FCALL velocity_partition_piece 3 <progress hash> <state lock> <partition record>
--   <lock token> <batch> <piece> <bucket ttl ms> <bucket ms> <keys changed>
--   <each changed key's run>...
-- Piece n (2, 3, ...) of a key-partition whose first piece is recorded: its changes
-- applied, once, after piece n - 1's. Each piece holds the same keys in every attempt (a
-- key's piece is a hash of its name), and a key changes only with its own piece, so an
-- attempt that decided a key before its piece was applied decided it as the first did: a
-- retried task finishes what a crashed one began. 0 when applied, 1 when applied before;
-- fenced (-2) and refused once the batch is committed (-1).
local function velocity_partition_piece(keys, args)
  local refused = refused_write(keys[1], keys[2], args[1], args[2])
  if refused then return refused end
  local state = redis.call("GET", keys[3] .. PIECES_SUFFIX) or ""
  local applied, pieces = string.match(state, "^(%d+)/(%d+)$")
  local piece = tonumber(args[3])
  if not applied or piece > tonumber(pieces) then
    return redis.error_reply("velocity_partition_piece: piece " .. args[3] .. " of a partition "
                             .. "whose record has " .. (pieces or "no") .. " pieces")
  end
  if piece <= tonumber(applied) then return 1 end
  if piece ~= tonumber(applied) + 1 then
    return redis.error_reply("velocity_partition_piece: piece " .. args[3] .. " before piece "
                             .. string.format("%d", tonumber(applied) + 1))
  end
  apply_bucket_changes(args, 7, tonumber(args[6]), args[4], tonumber(args[5]))
  redis.call("SET", keys[3] .. PIECES_SUFFIX, args[3] .. "/" .. pieces, "KEEPTTL")
  return 0
end

-- Redis Cluster. A micro-batch's keys live on several masters there, and a call may only
-- touch keys of the master it runs on, so the commit is staged (velocity/redis/cluster.py):
-- decide on the master of the progress (atomic, fenced), then finish: publish the alerts,
-- apply each master's bucket changes, drop the pending record. Each finishing step is
-- skipped where it was done already, so whoever finds a pending record finishes it.

-- FCALL velocity_cluster_decide 3 <progress hash> <state lock> <pending hash> <lock token>
--   <batch> <newest eventTime> <seen ttl ms> <pending json> <seen prefix>
--   <accepted transactionIds json>...
-- Fenced and refused for a replay as velocity_stream_commit (-2, -1); else the accepted
-- transactionIds, the pending record {batch, changes} and the progress, atomically (the
-- four share the data dir's hash tag, so one slot). 0 when done.
local function velocity_cluster_decide(keys, args)
  local refused = refused_write(keys[1], keys[2], args[1], args[2])
  if refused then return refused end
  for i = 7, #args do
    local ids = cjson.decode(args[i])
    remember_seen(args[6], tonumber(args[4]), ids, 1, #ids, args[2])
  end
  redis.call("DEL", keys[3])
  redis.call("HSET", keys[3], "batch", args[2], "changes", args[5])
  redis.call("HSET", keys[1], "batch", args[2], "newest", args[3], "at", ms_text(clock_ms()),
             "layout", STATE_LAYOUT)
  return 0
end

-- FCALL velocity_cluster_publish 1 <alert stream> <batch> <retention> <alert json>...
-- A decided batch's alerts, unless the stream's newest entry is of this batch or a later
-- one (a backfill's entries repeat the batch before them). The alerts published, or -1.
local function velocity_cluster_publish(keys, args)
  local last = redis.call("XREVRANGE", keys[1], "+", "-", "COUNT", 1)
  if #last > 0 then
    local entry = last[1][2]
    for i = 1, #entry, 2 do
      if entry[i] == "batch" and tonumber(entry[i + 1]) >= tonumber(args[1]) then
        return -1
      end
    end
  end
  local trim, bound = alert_trim(args[2])
  for i = 3, #args do
    redis.call("XADD", keys[1], trim, "~", bound, "*", "alert", args[i], "batch", args[1])
  end
  return #args - 2
end

-- FCALL velocity_cluster_apply 1 <applied marker> <batch> <bucket ttl ms> <bucket ms>
--   <keys changed> <each changed key's run>...
-- One master's bucket changes of a decided batch (runs as velocity_stream_commit's, of
-- this master's hashes only), unless its marker (a key on the same master) says the batch
-- is applied already (-1). 0 when applied.
local function velocity_cluster_apply(keys, args)
  local last = redis.call("GET", keys[1])
  if last and tonumber(last) >= tonumber(args[1]) then return -1 end
  apply_bucket_changes(args, 5, tonumber(args[4]), args[2], tonumber(args[3]))
  redis.call("SET", keys[1], args[1])
  return 0
end

-- FCALL velocity_cluster_done 1 <pending hash> <batch>
-- Drops the pending record once it is finished (1), unless it is another batch's (0).
local function velocity_cluster_done(keys, args)
  if redis.call("HGET", keys[1], "batch") == args[1] then return redis.call("DEL", keys[1]) end
  return 0
end

-- FCALL velocity_cluster_read_progress 2 <progress hash> <pending hash> <seen prefix>
--   <de-duplication horizon ms> <transactionIds json>
-- reply = {"p": {field: value}, "b": pending batch or "", "s": [1-based indices seen]}
local function velocity_cluster_read_progress(keys, args)
  local progress = {}
  local fields = redis.call("HGETALL", keys[1])
  for i = 1, #fields, 2 do progress[fields[i]] = fields[i + 1] end
  return cjson.encode({
    p = progress,
    b = redis.call("HGET", keys[2], "batch") or "",
    s = seen_indices(args[1], tonumber(args[2]), cjson.decode(args[3])),
  })
end

-- FCALL velocity_read_keys 1 <one of the keys> <key names json>
-- The named keys' fields, all on this master (of a Redis Cluster, or the one server), as
-- read_keys' text.
local function velocity_read_keys(keys, args)
  return read_keys(cjson.decode(args[1]))
end

-- FCALL velocity_pack 1 <key state>
-- Migration from the layout before packed keys (`velocity mirror migrate`): a key's hash
-- "<base>:buckets" becomes its packed string when it has fewer than ROLLUP_MIN_BUCKETS
-- buckets (roll-ups left out), else moves to "<base>:dense" with DENSE_TEXT in its place;
-- its TTL kept. 1 when packed, 2 when moved, 0 when left (migrated already, or gone).
local function velocity_pack(keys, args)
  if redis.call("TYPE", keys[1])["ok"] ~= "hash" then return 0 end
  local fields, buckets = state_fields(keys[1])
  local ttl = redis.call("PTTL", keys[1])
  local done = 1
  if buckets >= ROLLUP_MIN_BUCKETS then
    redis.call("RENAME", keys[1], dense_of(keys[1]))
    redis.call("SET", keys[1], DENSE_TEXT)
    done = 2
  else
    redis.call("SET", keys[1], packed_text(fields))
  end
  if ttl > 0 then redis.call("PEXPIRE", keys[1], ttl) end
  return done
end

redis.register_function{function_name = "velocity_window", callback = velocity_window,
                        flags = {"no-writes"}}
redis.register_function{function_name = "velocity_check", callback = velocity_check,
                        flags = {"no-writes", "allow-cross-slot-keys"}}
redis.register_function("velocity_evict", velocity_evict)
redis.register_function("velocity_pack", velocity_pack)
redis.register_function("velocity_put_buckets", velocity_put_buckets)
redis.register_function("velocity_publish_backfill", velocity_publish_backfill)
redis.register_function("velocity_unlock", velocity_unlock)
redis.register_function("velocity_renew", velocity_renew)
-- The stream's reads take as many transactionIds or keys as a batch has: their work grows
-- with their arguments, so they are not flagged no-writes, and the read-only user, who may
-- only FCALL_RO, cannot call them (SPEC §5a: no call of that user holds Redis for long).
redis.register_function("velocity_stream_read", velocity_stream_read)
redis.register_function("velocity_stream_commit", velocity_stream_commit)
redis.register_function("velocity_stream_alerts", velocity_stream_alerts)
redis.register_function("velocity_batch_plan", velocity_batch_plan)
redis.register_function("velocity_partition_commit", velocity_partition_commit)
redis.register_function("velocity_partition_piece", velocity_partition_piece)
redis.register_function("velocity_cluster_decide", velocity_cluster_decide)
redis.register_function("velocity_cluster_publish", velocity_cluster_publish)
redis.register_function{function_name = "velocity_cluster_apply", callback = velocity_cluster_apply,
                        flags = {"allow-cross-slot-keys"}}
redis.register_function("velocity_cluster_done", velocity_cluster_done)
redis.register_function("velocity_cluster_read_progress", velocity_cluster_read_progress)
redis.register_function{function_name = "velocity_read_keys", callback = velocity_read_keys,
                        flags = {"allow-cross-slot-keys"}}
