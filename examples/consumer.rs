//! A message consumer that handles duplicates with idemkv.
//!
//! Four consumer threads read from one queue that delivers every message two or three times,
//! some copies at the same moment (a redelivery while the first copy is still being worked
//! on). Each consumer charges a card through `Engine::run`: the charge happens once per
//! message, and every copy gets the same receipt.
//!
//! Run with `cargo run --example consumer`.

use idemkv::{ClaimOptions, Durability, Engine};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone)]
struct Message {
    id: String,
    amount_cents: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::Builder::new()
        .prefix("idemkv-consumer-")
        .tempdir()?;
    let engine = Engine::builder()
        .path(dir.path().join("consumer.redb"))
        .durability(Durability::Immediate)
        .lease(Duration::from_secs(30))
        .retention(Duration::from_secs(24 * 3600))
        .open()?;

    // 50 messages, each delivered 2 or 3 times, copies interleaved.
    let mut deliveries = Vec::new();
    for round in 0..3 {
        for i in 0..50u64 {
            if round < 2 || i % 2 == 0 {
                deliveries.push(Message {
                    id: format!("payment-{i}"),
                    amount_cents: 100 + i,
                });
            }
        }
    }
    let queue = Arc::new(Mutex::new(deliveries));
    let charges: Arc<Mutex<HashMap<String, u32>>> = Arc::default();

    let consumers: Vec<_> = (0..4)
        .map(|_| {
            let (engine, queue, charges) = (engine.clone(), queue.clone(), charges.clone());
            std::thread::spawn(move || -> Result<(usize, usize), String> {
                let (mut fresh, mut replayed) = (0, 0);
                loop {
                    let Some(msg) = queue.lock().map_err(|e| e.to_string())?.pop() else {
                        return Ok((fresh, replayed));
                    };
                    let opts = ClaimOptions::default().payload(&msg.amount_cents.to_le_bytes());
                    let outcome = engine
                        .run(msg.id.as_bytes(), &opts, |lease| {
                            // The side effect: charge the card. The fencing token goes along
                            // so a downstream system could refuse a superseded holder.
                            std::thread::sleep(Duration::from_millis(2));
                            *charges
                                .lock()
                                .map_err(|e| e.to_string())?
                                .entry(msg.id.clone())
                                .or_default() += 1;
                            Ok::<_, String>(
                                format!("receipt {} token {}", msg.id, lease.token()).into_bytes(),
                            )
                        })
                        .map_err(|e| e.to_string())?;
                    if outcome.replayed() {
                        replayed += 1;
                    } else {
                        fresh += 1;
                    }
                }
            })
        })
        .collect();

    let (mut fresh, mut replayed) = (0, 0);
    for consumer in consumers {
        let (f, r) = consumer.join().map_err(|_| "consumer panicked")??;
        fresh += f;
        replayed += r;
    }
    let charges = charges.lock().map_err(|e| e.to_string())?;
    let doubles = charges.values().filter(|&&n| n > 1).count();
    println!("deliveries handled: {}", fresh + replayed);
    println!("charges executed:   {fresh} (one per message)");
    println!("duplicates replayed: {replayed}");
    println!("double charges:     {doubles}");
    engine.close()?;
    dir.close()?;
    if doubles > 0 {
        return Err("a message was charged twice".into());
    }
    Ok(())
}
