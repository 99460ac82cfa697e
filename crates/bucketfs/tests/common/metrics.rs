//! The daemon's Prometheus endpoint (`--metrics-addr`), scraped as a program would.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The samples of one scrape: `name{labels}` → value.
pub fn scrape(address: &str) -> HashMap<String, f64> {
    let mut stream = TcpStream::connect(address).expect("connect to the metrics endpoint");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").expect("request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.") && head.contains(" 200 "), "{head}");
    body.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| {
            let (sample, value) = line.rsplit_once(' ')?;
            Some((sample.to_owned(), value.parse().ok()?))
        })
        .collect()
}

pub fn value(samples: &HashMap<String, f64>, sample: &str) -> f64 {
    samples.get(sample).copied().unwrap_or(0.0)
}
