#!lua name=memq
-- memq's Redis function library (Redis >= 7.0). Loaded by the services' user (the dispatcher, on
-- its first relay, or `memq relay load`), never by an agent.
--
-- Why a relay and not an agent-facing function: Redis runs the commands a function calls with the
-- ACL of the user who called FCALL, so a function cannot do for an agent what the agent may not do
-- itself. The agent therefore gets RPUSH on one list (`<stream>:inbox`): RPUSH takes no options, so
-- it cannot trim, delete, choose a stream ID or read anything back. The dispatcher (trusted) calls
-- memq_relay, which moves inbox elements into the stream with arguments the agent never chooses.
--
-- An inbox element is a JSON array of strings, field name and value alternating:
--   ["v","1","kind","stats","run","r1", ...]
-- Anything else (junk, numbers, too many or too long fields) is dropped here, counted in the reply
-- (`refused`): the dispatcher writes one dead letter per call saying how many, never one per element.
-- Relaying junk as entries cost the dispatcher a dead letter each (~3,700 a second), while the agent
-- user can RPUSH far more (200,000 one-byte elements in 0.1 s): every other job's entries waited
-- behind them. Dropping costs an LPOP and a cheap check per element, as much as the push itself, and
-- a call drops up to MAX_DROPS_PER_CALL of them besides the `count` it moves.

local VERSION = 5
local MAX_ELEMENT_BYTES = 2 * 1024 * 1024  -- an envelope is < 1.1 MiB (payload cap 1 MiB)
local MAX_PAIRS = 32                      -- envelopes have 15 fields
local MAX_NAME_BYTES = 64
local MAX_VALUE_BYTES = 1100000
local MAX_CALL_BYTES = 16 * 1024 * 1024   -- per memq_relay call: Redis serves nobody else meanwhile
-- per call, beside `count` moves: 100,000 drops take ~50 ms of Redis time (benchmarks/bench_inbox_flood.py)
local MAX_DROPS_PER_CALL = 100000
-- 256: a call holds at most 256 popped elements at once (each under the 2 MiB cap or junk that is
-- already in Redis memory, which maxmemory bounds)
local POP_CHUNK = 256
local MIN_ELEMENT_BYTES = 10              -- the shortest envelope, ["v","1","kind","stats",...], is longer
-- Drops of elements without a known key id cost more than junk: a string search (~10x a junk element)
-- or, where the text names a known kid, a JSON decode (~20x). A call stops once its drops cost as much
-- as MAX_DROPS_PER_CALL junk elements (~100 ms of Redis time).
local COST_SEARCHED, COST_DECODED = 10, 20

local function decode(raw)
  if type(raw) ~= 'string' then return nil, 'not a string' end
  -- before any parsing: junk floods are short and never start like a JSON array
  if #raw < MIN_ELEMENT_BYTES or raw:byte(1) ~= 91 then return nil, 'not a JSON array' end
  if #raw > MAX_ELEMENT_BYTES then return nil, 'element of ' .. #raw .. ' bytes is over the limit' end
  local ok, arr = pcall(cjson.decode, raw)
  if not ok then return nil, 'not JSON' end
  if type(arr) ~= 'table' then return nil, 'not a JSON array' end
  local n = #arr
  if n == 0 or n % 2 ~= 0 then return nil, 'not an even, non-empty array of strings' end
  if n > 2 * MAX_PAIRS then return nil, 'more than ' .. MAX_PAIRS .. ' fields' end
  local count = 0
  for _ in pairs(arr) do count = count + 1 end
  if count ~= n then return nil, 'not a JSON array' end
  for i = 1, n do
    local v = arr[i]
    if type(v) ~= 'string' then return nil, 'item ' .. i .. ' is not a string' end
    local cap = (i % 2 == 1) and MAX_NAME_BYTES or MAX_VALUE_BYTES
    if #v > cap then return nil, 'item ' .. i .. ' is longer than ' .. cap .. ' bytes' end
  end
  return arr, nil
end

local function is_sha256(s)
  return type(s) == 'string' and #s == 64 and not s:find('[^0-9a-f]')
end

local function is_nonce(s)
  return type(s) == 'string' and #s == 32 and not s:find('[^0-9a-f]')
end

-- ARGV[5], where the dispatcher holds a keyring: its key ids, comma separated. Then an element
-- that carries no signature of one of them (no `kid`, an unknown kid, a `sig` that is not 64 hex
-- digits) is dropped here like junk: a well-formed but unsigned flood costs the relay a string search
-- each instead of a dead letter each at the dispatcher (one per ~0.3 ms: every other job's entries
-- waited behind it). Whether the signature is right is still the dispatcher's check, so an element
-- naming a known kid with a wrong signature still reaches it (key ids are not secrets).
local function kid_set(s)
  if type(s) ~= 'string' or s == '' then return nil end
  local set = {}
  for k in string.gmatch(s, '[^,]+') do set[k] = true end
  return set
end

-- Before any JSON decode (~20 us for an envelope): an element whose text names no known key id is
-- dropped at the cost of a string search, and its own blob (a nonce key, named in the same text) goes.
local function cheap_unsigned(raw, kids, prefix)
  -- every `"kid","..."` of the text (a value "kid" may come before the real field; values cannot
  -- hold an unescaped quote, so nothing inside a value matches)
  for kid in raw:gmatch('"kid"%s*,%s*"([A-Za-z0-9_.:%-]+)"') do
    if kids[kid] then return false end
  end
  if raw:find('"kind"%s*,%s*"snapshot"') then
    local sha = raw:match('"sha256"%s*,%s*"(%x+)"')
    local nonce = raw:match('"nonce"%s*,%s*"(%x+)"')
    if is_sha256(sha) and is_nonce(nonce) then
      redis.call('DEL', prefix .. 'blob:' .. sha .. ':' .. nonce)
    end
  end
  return true
end

local function signed(fields, kids)
  local kid, sig
  for k = 1, #fields, 2 do
    if fields[k] == 'kid' then kid = fields[k + 1]
    elseif fields[k] == 'sig' then sig = fields[k + 1] end
  end
  return kid ~= nil and kids[kid] == true and is_sha256(sig)
end

-- Entries of the stream that no consumer group has read yet. The relay never moves more than the
-- stream has room for beside them: its own XADD MAXLEN ~ would otherwise trim entries no dispatcher
-- has read (a flood pushed into the inbox ahead of other jobs' entries lost them all). A group whose
-- lag Redis cannot tell (entries deleted inside its range) counts the whole stream as unread.
local function unread(stream)
  local len = redis.pcall('XLEN', stream)
  if type(len) ~= 'number' then return 0 end  -- not a stream: the XADD below says why
  if len == 0 then return 0 end
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) ~= 'table' or groups.err or #groups == 0 then return len end
  local most = 0
  for _, g in ipairs(groups) do
    local lag = false
    for i = 1, #g, 2 do
      if g[i] == 'lag' then lag = g[i + 1] end
    end
    if type(lag) ~= 'number' then return len end
    if lag > most then most = lag end
  end
  return most
end

-- memq_relay KEYS: inbox (list), stream; ARGV: max elements, stream MAXLEN (~), blob key prefix,
-- blob TTL cap (s), and optionally the keyring's key ids (comma separated: only elements signed with
-- one of them are relayed). Returns {moved, refused, error-or-empty} (the shape of every version: dispatchers
-- of an older release keep working while a newer one upgrades the library). A call stops after
-- MAX_CALL_BYTES or MAX_DROPS_PER_CALL, so one call blocks Redis briefly. An element the stream does not take (wrong type, exhausted IDs, OOM) goes
-- back to the head of the inbox and the call stops there.
local function relay(keys, args)
  local inbox, stream = keys[1], keys[2]
  local count = tonumber(args[1])
  local maxlen = tonumber(args[2])
  local prefix = args[3]
  local ttl = tonumber(args[4])
  if not (inbox and stream and count and maxlen and prefix and ttl) or count < 1 or maxlen < 1 or ttl < 1 then
    return redis.error_reply('memq_relay: KEYS inbox stream; ARGV count maxlen blob-prefix ttl-cap')
  end
  local kids = kid_set(args[5])
  local moved, refused, err, used, cost = 0, 0, '', 0, 0
  local room = math.floor(maxlen) - unread(stream)
  local take = math.min(math.floor(count), room)
  if take < 1 then
    return {0, 0, ''}
  end
  -- Elements are popped POP_CHUNK at a time: one LPOP per element cost ~3.4 us each, four times what
  -- the agent's RPUSH of the same element costs Redis; 256 at a time ~0.5 us. What a stop leaves of
  -- the chunk goes back to the head of the inbox, in order.
  local stop = false
  while not stop and moved < take do
    local chunk = redis.call('LPOP', inbox, POP_CHUNK)
    if not chunk then break end
    local n = #chunk
    local i = 0
    while i < n and not stop do
      i = i + 1
      local raw = chunk[i]
      local fields = nil
      local searched = kids and type(raw) == 'string' and #raw >= MIN_ELEMENT_BYTES
      if searched and cheap_unsigned(raw, kids, prefix) then
        cost = cost + COST_SEARCHED
      else
        fields = decode(raw)
        cost = cost + (searched and not fields and COST_SEARCHED or 1)
      end
      if fields and kids and not signed(fields, kids) then
        -- its own blob goes with it: a key with a nonce is this element's alone (nobody can name it
        -- without reading the element); a bare key may be shared by other entries and keeps its TTL
        local kind, sha, nonce
        for k = 1, #fields, 2 do
          if fields[k] == 'kind' then kind = fields[k + 1]
          elseif fields[k] == 'sha256' then sha = fields[k + 1]
          elseif fields[k] == 'nonce' then nonce = fields[k + 1] end
        end
        if kind == 'snapshot' and is_sha256(sha) and is_nonce(nonce) then
          redis.call('DEL', prefix .. 'blob:' .. sha .. ':' .. nonce)
        end
        fields = nil
        cost = cost + COST_DECODED
      end
      if not fields then
        refused = refused + 1
        used = used + #raw
        stop = cost >= MAX_DROPS_PER_CALL or used >= MAX_CALL_BYTES
      else
        local res = redis.pcall('XADD', stream, 'MAXLEN', '~', tostring(math.floor(maxlen)), '*', unpack(fields))
        if type(res) == 'table' and res.err then
          i = i - 1  -- this one goes back too
          err = res.err
          stop = true
        else
          moved = moved + 1
          -- The agent SETs its blob itself; whatever TTL it chose (or none), a relayed snapshot's
          -- blob lives at most the deployment's TTL.
          local kind, sha, nonce
          for k = 1, #fields, 2 do
            if fields[k] == 'kind' then kind = fields[k + 1]
            elseif fields[k] == 'sha256' then sha = fields[k + 1]
            elseif fields[k] == 'nonce' then nonce = fields[k + 1] end
          end
          if kind == 'snapshot' and is_sha256(sha) then
            local key = prefix .. 'blob:' .. sha
            if is_nonce(nonce) then key = key .. ':' .. nonce end  -- envelope.blob_key
            local left = redis.call('TTL', key)
            if left == -1 or left > ttl then redis.call('EXPIRE', key, math.floor(ttl)) end
          end
          used = used + #raw
          stop = used >= MAX_CALL_BYTES or moved >= take
        end
      end
    end
    for k = n, i + 1, -1 do  -- the rest of the chunk, back in front, in its order
      redis.call('LPUSH', inbox, chunk[k])
    end
  end
  return {moved, refused, err}
end

local function version()
  return VERSION
end

redis.register_function{function_name = 'memq_relay', callback = relay}
redis.register_function{function_name = 'memq_version', callback = version, flags = {'no-writes'}}
