//! A minimal Redis client: RESP2 over one blocking TCP connection, the commands this
//! example sends and nothing more (no pooling, no reconnects, no cluster).

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The example's error: Redis, the disk and the engine all report through it.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, Error>;

/// A reply. Errors the server sends back (`-ERR ...`) are `Err` from [`Conn::cmd`] instead.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Nil,
    Int(i64),
    Bytes(Vec<u8>),
    Array(Vec<Value>),
    /// An error inside an array (a command of a transaction that failed).
    Error(String),
}

/// An error reply (`-ERR ...`) or a reply of an unexpected shape.
#[derive(Debug)]
pub struct RedisError(pub String);

impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redis: {}", self.0)
    }
}

impl std::error::Error for RedisError {}

fn shape(what: &str, v: &Value) -> Error {
    Box::new(RedisError(format!("expected {what}, got {v:?}")))
}

impl Value {
    pub fn int(&self) -> Result<i64> {
        match self {
            Value::Int(n) => Ok(*n),
            Value::Bytes(b) => std::str::from_utf8(b)?.parse().map_err(Into::into),
            v => Err(shape("an integer", v)),
        }
    }

    pub fn bytes(&self) -> Result<&[u8]> {
        match self {
            Value::Bytes(b) => Ok(b),
            v => Err(shape("a string", v)),
        }
    }

    pub fn string(&self) -> Result<String> {
        Ok(String::from_utf8(self.bytes()?.to_vec())?)
    }

    /// An array's items; `Nil` (a blocking read that timed out) is the empty array.
    pub fn array(&self) -> Result<&[Value]> {
        match self {
            Value::Array(items) => Ok(items),
            Value::Nil => Ok(&[]),
            v => Err(shape("an array", v)),
        }
    }

    pub fn opt_string(&self) -> Result<Option<String>> {
        match self {
            Value::Nil => Ok(None),
            v => v.string().map(Some),
        }
    }
}

/// One connection. Not shared between threads: each consumer, the reclaimer and the
/// producer have their own (a blocking XREADGROUP holds its connection).
pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    /// Connects to `addr` (`host:port`, or a `redis://host:port[/]` URL).
    pub fn connect(addr: &str) -> Result<Conn> {
        let addr = addr
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_string();
        let stream = TcpStream::connect(&addr)?;
        stream.set_nodelay(true)?;
        // A server that stops answering fails the call instead of hanging the consumer.
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Sends one command and reads its reply.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<Value> {
        let mut buf = Vec::new();
        encode(&mut buf, args);
        self.writer.write_all(&buf)?;
        self.read()
    }

    /// Sends `MULTI`, the commands and `EXEC` in one write: the commands apply together or
    /// not at all, even if this process is killed halfway through sending. Returns EXEC's
    /// replies, one per command.
    pub fn transaction(&mut self, cmds: &[Vec<Vec<u8>>]) -> Result<Vec<Value>> {
        let mut buf = Vec::new();
        encode(&mut buf, &["MULTI"]);
        for c in cmds {
            encode(&mut buf, c);
        }
        encode(&mut buf, &["EXEC"]);
        self.writer.write_all(&buf)?;
        // +OK for MULTI, +QUEUED for each command (an error here aborts EXEC).
        for _ in 0..=cmds.len() {
            self.read()?;
        }
        let replies = self.read()?;
        let replies = replies.array()?.to_vec();
        for r in &replies {
            if let Value::Error(e) = r {
                return Err(Box::new(RedisError(e.clone())));
            }
        }
        Ok(replies)
    }

    fn read(&mut self) -> Result<Value> {
        match read_value(&mut self.reader)? {
            Value::Error(e) => Err(Box::new(RedisError(e))),
            v => Ok(v),
        }
    }
}

fn encode<A: AsRef<[u8]>>(buf: &mut Vec<u8>, args: &[A]) {
    buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        let a = a.as_ref();
        buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

fn read_line(r: &mut impl BufRead) -> Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(Box::new(RedisError("connection closed".into())));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn read_value(r: &mut impl BufRead) -> Result<Value> {
    let line = read_line(r)?;
    let (kind, rest) = line.split_at_checked(1).unwrap_or(("", ""));
    match kind {
        "+" => Ok(Value::Bytes(rest.as_bytes().to_vec())),
        "-" => Ok(Value::Error(rest.to_string())),
        ":" => Ok(Value::Int(rest.parse()?)),
        "$" => {
            let len: i64 = rest.parse()?;
            let Ok(len) = usize::try_from(len) else {
                return Ok(Value::Nil);
            };
            let mut data = vec![0; len + 2];
            r.read_exact(&mut data)?;
            data.truncate(len);
            Ok(Value::Bytes(data))
        }
        "*" => {
            let len: i64 = rest.parse()?;
            let Ok(len) = usize::try_from(len) else {
                return Ok(Value::Nil);
            };
            (0..len)
                .map(|_| read_value(r))
                .collect::<Result<Vec<_>>>()
                .map(Value::Array)
        }
        _ => Err(Box::new(RedisError(format!(
            "unexpected reply line {line:?}"
        )))),
    }
}

/// A command's arguments as owned byte strings, for [`Conn::transaction`].
pub fn args(parts: &[&[u8]]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.to_vec()).collect()
}
