//! The integration tests: one test binary (each binary links the whole crate and libtorch, so one
//! link instead of one per file), a module per concern, against the real RabbitMQ, Postgres and
//! SeaweedFS (`common` gives each test its own queues, database and key prefix).
//!
//! `faults::` and `cluster::` tests are `#[ignore]`d in the ordinary run: `scripts/test.sh` runs
//! `faults::` alone afterwards, `make test-cluster` runs `cluster::`.

mod common;

mod bench;
mod campaigns;
mod cli;
mod cluster;
mod compiled;
mod converter;
mod cosyvoice2_llm_parity;
mod cosyvoice2_parity;
mod cosyvoice2_text_worker;
mod cosyvoice2_tts;
mod cosyvoice2_worker;
mod cosyvoice3_compiled;
mod cosyvoice3_llm_parity;
mod cosyvoice3_parity;
mod cosyvoice3_tts;
mod cosyvoice3_worker;
mod dead_letters;
mod events;
mod faults;
mod fencing;
mod fleet;
mod frontend;
mod house_rules;
mod memory_policy;
mod metrics;
mod multi_worker;
mod output_formats;
mod pipeline;
mod reliability;
mod report;
mod spool;
mod voice;
mod voices;
