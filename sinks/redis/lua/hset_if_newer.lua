-- KEYS[1] hash
-- KEYS[2] index?
-- ARGV[1] order_field
-- ARGV[2] order_value
-- ARGV[3] tie_field
-- ARGV[4] tie_value
-- ARGV[5] index_member
-- ARGV[6..] fields
-- `fields`: field/value pairs. Written unless the hash holds a later (order, tie): a
-- greater order value, or the same one with a greater tie value (absent: 0). A tie value of
-- 0 is not stored (the field is removed), so records without one write the fields they
-- always did.
local cur = redis.call('HMGET', KEYS[1], ARGV[1], ARGV[3])
local order, tie = tonumber(ARGV[2]), tonumber(ARGV[4])
if cur[1] then
  local held = tonumber(cur[1])
  if held > order or (held == order and tonumber(cur[2] or '0') > tie) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], unpack(ARGV, 6))
if tie == 0 then redis.call('HDEL', KEYS[1], ARGV[3])
else redis.call('HSET', KEYS[1], ARGV[3], ARGV[4]) end
if KEYS[2] then redis.call('ZADD', KEYS[2], 'GT', ARGV[2], ARGV[5]) end
return 1
