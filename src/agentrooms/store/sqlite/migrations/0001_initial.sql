-- Migration 0001: the initial schema (records, events, rooms, revision).
--
-- Applied by agentrooms.store.sqlite.sql.migrate inside BEGIN IMMEDIATE, which then sets
-- PRAGMA user_version = 1. Statements only: no BEGIN/COMMIT here.

CREATE TABLE records (
    room       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    value      TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    expires_ms INTEGER,
    PRIMARY KEY (room, key)
);

CREATE TABLE events (
    room    TEXT    NOT NULL,
    seq     INTEGER NOT NULL,
    type    TEXT    NOT NULL,
    data    TEXT    NOT NULL,
    time_ms INTEGER NOT NULL,
    PRIMARY KEY (room, seq)
);

CREATE TABLE rooms (
    room TEXT    NOT NULL PRIMARY KEY,
    seq  INTEGER NOT NULL DEFAULT 0,
    low  INTEGER NOT NULL DEFAULT 1
) WITHOUT ROWID;

CREATE TABLE revision (
    id   INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);

INSERT INTO revision (id, last) VALUES (1, 0);
