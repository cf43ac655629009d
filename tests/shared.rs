//! The shared backend over PostgreSQL (feature `postgres`): run with `scripts/pg.sh test`.
#![cfg(feature = "postgres")]
