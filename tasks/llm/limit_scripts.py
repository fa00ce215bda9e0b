"""The Lua scripts that count a model's shared limits in Redis (``shared_limits``).

Each runs atomically in Redis and reads the time from Redis's own clock, so every machine that
shares a model agrees on lease ends and start times. A model's keys share one hash tag, so the
scripts also run on a Redis Cluster; they vanish after ``KEY_TTL_S`` unused, and the slot queue's
two sorted sets as soon as they are empty.
"""

KEY_TTL_S = 86_400  # a model's keys vanish after a day unused

# Every script reads the time from Redis: one clock for all machines.
NOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
"""

# KEYS: order (token -> when it first asked, server time), lease (token -> lease end), pace (hash).
# ARGV: limit, lease_s, channel, token...   ->  {queued, pause_left, {granted token...}}
ACQUIRE = (
    NOW
    + """
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1000)
if #expired > 0 then
  redis.call('ZREM', KEYS[1], unpack(expired))
  redis.call('ZREM', KEYS[2], unpack(expired))
  redis.call('PUBLISH', ARGV[3], 'released')
end
local limit, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local granted, refused = {}, false
for i = 4, #ARGV do
  if not redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], now, ARGV[i])
  end
  redis.call('ZADD', KEYS[2], now + lease, ARGV[i])
  if redis.call('ZRANK', KEYS[1], ARGV[i]) < limit then table.insert(granted, ARGV[i]) else refused = true end
end
if refused then redis.call('PUBLISH', ARGV[3], 'waiting') end
for i = 1, 2 do redis.call('EXPIRE', KEYS[i], KEY_TTL) end
local pause = tonumber(redis.call('HGET', KEYS[3], 'paused_until') or '0') - now
return {redis.call('ZCARD', KEYS[1]), tostring(math.max(pause, 0)), granted}
""".replace("KEY_TTL", str(KEY_TTL_S))
)

# KEYS: order, lease. ARGV: channel, token...  ->  tokens queued after
RELEASE = """
redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
redis.call('ZREM', KEYS[2], unpack(ARGV, 2))
redis.call('PUBLISH', ARGV[1], 'released')
return redis.call('ZCARD', KEYS[1])
"""

# KEYS: order, lease. ARGV: lease_s, token...  ->  {queued, {token no longer held...}}
RENEW = (
    NOW
    + """
local missing = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), ARGV[i])
  else
    table.insert(missing, ARGV[i])
  end
end
for i = 1, 2 do redis.call('EXPIRE', KEYS[i], KEY_TTL) end
return {redis.call('ZCARD', KEYS[1]), missing}
""".replace("KEY_TTL", str(KEY_TTL_S))
)

# KEYS: pace, turns (asker -> when it first asked), turn leases (asker -> when its place lapses).
# ARGV: seconds between starts (0: no rpm), tpm (0: none), tokens, asker, grace
#   ->  {admitted, wait, pause_left}
# rpm admits a request only when its turn has come and its asker heads the line of askers (one per
# process and model, in the order they first asked), so the processes that share a model take
# turns and requests that wake late cannot bunch up. An asker not admitted asks again after
# ``wait``; its place lapses ``grace`` seconds after that, so a killed process holds up the others
# no longer. tpm is a bucket the admitted request may overdraw, then waits off the debt.
PACE = (
    NOW
    + """
local pause = math.max(tonumber(redis.call('HGET', KEYS[1], 'paused_until') or '0') - now, 0)
local interval = tonumber(ARGV[1])
if interval > 0 then
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1000)
  if #lapsed > 0 then
    redis.call('ZREM', KEYS[2], unpack(lapsed))
    redis.call('ZREM', KEYS[3], unpack(lapsed))
  end
  local asker = ARGV[4]
  redis.call('ZADD', KEYS[2], 'NX', now, asker)
  local turn = tonumber(redis.call('HGET', KEYS[1], 'next') or '0')
  local place = redis.call('ZRANK', KEYS[2], asker)
  if turn > now or place > 0 then
    -- the askers ahead take the turns before this one's (one a turn); ask again when it comes
    local wait = math.max(turn - now, 0) + place * interval
    redis.call('ZADD', KEYS[3], now + wait + tonumber(ARGV[5]), asker)
    for i = 2, 3 do redis.call('EXPIRE', KEYS[i], KEY_TTL) end
    return {0, tostring(wait), tostring(pause)}
  end
  redis.call('ZREM', KEYS[2], asker)
  redis.call('ZREM', KEYS[3], asker)
  redis.call('HSET', KEYS[1], 'next', tostring(now + interval))
end
local wait = 0
local tpm, tokens = tonumber(ARGV[2]), tonumber(ARGV[3])
if tpm > 0 and tokens > 0 then
  local rate = tpm / 60
  local level = tonumber(redis.call('HGET', KEYS[1], 'level') or tpm)
  local filled = tonumber(redis.call('HGET', KEYS[1], 'filled_at') or now)
  level = math.min(tpm, level + (now - filled) * rate) - math.min(tokens, tpm)
  redis.call('HSET', KEYS[1], 'level', tostring(level), 'filled_at', tostring(now))
  if level < 0 then wait = -level / rate end
end
redis.call('EXPIRE', KEYS[1], KEY_TTL)
return {1, tostring(wait), tostring(pause)}
""".replace("KEY_TTL", str(KEY_TTL_S))
)

# KEYS: pace. ARGV: seconds, channel. Publishes the pause left to every process.
PAUSE = (
    NOW
    + """
local until_ = math.max(now + tonumber(ARGV[1]), tonumber(redis.call('HGET', KEYS[1], 'paused_until') or '0'))
redis.call('HSET', KEYS[1], 'paused_until', tostring(until_))
redis.call('EXPIRE', KEYS[1], KEY_TTL)
redis.call('PUBLISH', ARGV[2], 'pause:' .. tostring(until_ - now))
return 1
""".replace("KEY_TTL", str(KEY_TTL_S))
)
