-- The LISTEN/NOTIFY channel of this schema's store: transact() notifies it with
-- "room:seq" (the room and its newest sequence number) when it appends; watch() listens.
-- A channel name is at most 63 bytes: schemas whose names share their first 52 bytes
-- share a channel, which costs their watchers only a spurious wake-up.
-- No SET clause, so that it is inlined: see room_lock().
CREATE OR REPLACE FUNCTION notify_channel() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT left('agentrooms.' || current_schema(), 63)
$$;
