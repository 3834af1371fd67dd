-- KEYS hash[, index]. ARGV order field, order value, index member, field/value pairs.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and tonumber(cur) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], unpack(ARGV, 4))
if KEYS[2] then redis.call('ZADD', KEYS[2], 'GT', ARGV[2], ARGV[3]) end
return 1
