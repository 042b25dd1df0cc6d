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
-- Anything else (junk, numbers, too many or too long fields) is relayed as a stub entry with
-- v=0 and a relay_error field, so the dispatcher dead-letters it with the reason and nothing blocks.

local VERSION = 3
local MAX_ELEMENT_BYTES = 2 * 1024 * 1024  -- an envelope is < 1.1 MiB (payload cap 1 MiB)
local MAX_PAIRS = 32                      -- envelopes have 15 fields
local MAX_NAME_BYTES = 64
local MAX_VALUE_BYTES = 1100000
local MAX_CALL_BYTES = 16 * 1024 * 1024   -- per memq_relay call: Redis serves nobody else meanwhile

local function decode(raw)
  if type(raw) ~= 'string' then return nil, 'not a string' end
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
-- blob TTL cap (s). Returns {moved, refused, error-or-empty} (the shape of every version: dispatchers
-- of an older release keep working while a newer one upgrades the library). Elements are popped one at a time (a
-- huge one is in memory once, then garbage) and a call stops after MAX_CALL_BYTES, so one call
-- blocks Redis briefly. An element the stream does not take (wrong type, exhausted IDs, OOM) goes
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
  local moved, refused, err, used = 0, 0, '', 0
  local room = math.floor(maxlen) - unread(stream)
  local take = math.min(math.floor(count), room)
  if take < 1 then
    return {0, 0, ''}
  end
  for _ = 1, take do
    local raw = redis.call('LPOP', inbox)
    if not raw then break end
    local fields, why = decode(raw)
    local stub = not fields
    if stub then fields = {'v', '0', 'relay_error', why, 'bytes', tostring(#raw)} end
    local res = redis.pcall('XADD', stream, 'MAXLEN', '~', tostring(math.floor(maxlen)), '*', unpack(fields))
    if type(res) == 'table' and res.err then
      redis.call('LPUSH', inbox, raw)
      err = res.err
      break
    end
    moved = moved + 1
    if stub then refused = refused + 1 end
    -- The agent SETs its blob itself; whatever TTL it chose (or none), a relayed snapshot's blob
    -- lives at most the deployment's TTL.
    local kind, sha, nonce
    for i = 1, #fields, 2 do
      if fields[i] == 'kind' then kind = fields[i + 1]
      elseif fields[i] == 'sha256' then sha = fields[i + 1]
      elseif fields[i] == 'nonce' then nonce = fields[i + 1] end
    end
    if kind == 'snapshot' and is_sha256(sha) then
      local key = prefix .. 'blob:' .. sha
      if is_nonce(nonce) then key = key .. ':' .. nonce end  -- envelope.blob_key
      local left = redis.call('TTL', key)
      if left == -1 or left > ttl then redis.call('EXPIRE', key, math.floor(ttl)) end
    end
    used = used + #raw
    if used >= MAX_CALL_BYTES then break end
  end
  return {moved, refused, err}
end

local function version()
  return VERSION
end

redis.register_function{function_name = 'memq_relay', callback = relay}
redis.register_function{function_name = 'memq_version', callback = version, flags = {'no-writes'}}
