-- KEYS[1] positions
-- ARGV[1..] offsets
-- `offsets`: field, offset, ...: each offset only moves forward.
for i = 1, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if not cur or tonumber(cur) < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 1
