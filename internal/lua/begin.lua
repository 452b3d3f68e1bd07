-- begin.lua: start an attempt on KEYS[1], or report why not.
--
-- KEYS[1]  the record
-- ARGV[1]  token: 16 random bytes; this call's id, and the lease token if it acquires
-- ARGV[2]  owner ('' for none)
-- ARGV[3]  fingerprint ('' for none)
-- ARGV[4]  lease in ms
-- ARGV[5]  retention in s
-- ARGV[6]  the client's key, kept in the record
-- ARGV[7]  '1': acquire nothing (the tenant is over its stored-bytes budget
--          or holds its in_progress limit, or the master keeps its memory for
--          the outcomes in flight); '' or absent: acquire when the key is free
-- ARGV[8]  '1': replay nothing (the tenant is over its read budget);
--          '' or absent: replay a finished record
--
-- Taking over an expired lease publishes the ended attempt on
-- KEYS[1] .. ':end', so that waiters elsewhere wake and wait for the new one.
--
-- A re-run of this call (the same call sent again) changes nothing but
-- still writes the record's expiry again (reaffirm, in record.lua), so that
-- WAIT on its connection confirms the first run's write.
--
-- Reply {code, now_ms, record[, size]}: size, the record's whole length,
-- comes with DONE when the record is longer than INLINE: the record sent
-- is then its head only, and idemsvc reads the response itself.
--   OK          acquired (or re-begun by the same owner, or this call ran before)
--   BUSY        someone else holds a live lease
--   DONE        completed, or failed terminally: replay the record
--   MISMATCH    the fingerprint differs (no record in the reply)
--   REFUSED     ARGV[7] is '1' and the begin would acquire (no record)
--   UNREAD      ARGV[8] is '1' and the begin would replay (no record)
local REFUSED, UNREAD = 6, 7
local now = now_ms()
local raw, size = read_record()
local state, attempt, created, lease, expires, token, owner, fingerprint, retryable, _
if raw then
  state, _, retryable, attempt, created, _, lease, expires, _, token, _, owner,
    fingerprint = decode(raw)
  if ARGV[3] ~= '' and fingerprint ~= '' and fingerprint ~= ARGV[3] then
    return {MISMATCH, now}
  end
  if state == IN_PROGRESS then
    if token == ARGV[1] then -- this call, sent again
      reaffirm(expires)
      return {OK, now, raw}
    end
    if lease > now then
      if ARGV[2] ~= '' and owner == ARGV[2] then
        reaffirm(expires)
        return {OK, now, raw}
      end
      return {BUSY, now, raw}
    end
  elseif retryable == 0 then
    if ARGV[8] == '1' then return {UNREAD, now} end
    if #raw < size then return {DONE, now, raw, size} end
    return {DONE, now, raw}
  end
end

if ARGV[7] == '1' then return {REFUSED, now} end

-- Acquire: a new key, a released key, or an expired lease taken over. An
-- in-progress record outlives its lease by the retention, so that a takeover
-- still finds it and counts the attempt on.
local lease_ms, retention = tonumber(ARGV[4]), tonumber(ARGV[5])
local recovered = 0
if raw then
  attempt = attempt + 1
  if state == IN_PROGRESS then
    recovered = 1
    announce(attempt - 1)
  end
  if ARGV[3] ~= '' then fingerprint = ARGV[3] end
else
  attempt, created, fingerprint = 1, now, ARGV[3]
end
lease = now + lease_ms
expires = lease + retention * 1000
local head = pack(IN_PROGRESS, recovered, 0, attempt, created, now, lease,
  expires, retention, ARGV[1], NO_CALL, ARGV[2], fingerprint, ARGV[6], '')
store(head, '', expires)
return {OK, now, head}
