//! A trainer in Rust driving the MLX worker (`python -m recipes.rlaif_worker`) over JSON-RPC 2.0
//! on its stdin/stdout, as the seed's design has it: generation and training in the worker,
//! rewards and advantages here. Standard library only (a minimal JSON reader/writer below), so
//! it builds offline.
//!
//! Run: worker_client <python> <repo root> <run dir>
//! Does: initialize -> (a malformed line, an unknown method: errors, worker goes on) ->
//! generate -> reward (share of ASCII letters, in Rust) -> group-normalised advantages ->
//! train_step -> save -> generate the next batch -> kill the worker (SIGKILL) -> start a new
//! one -> initialize -> load -> train_step on that batch -> shutdown. Writes batch1.json and
//! batch2.json (the train_step params sent) to the run dir and prints one JSON summary line.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

// ------------------------------------------------------------------------------------ JSON

#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    fn get(&self, key: &str) -> &Json {
        static NULL: Json = Json::Null;
        match self {
            Json::Obj(m) => m.get(key).unwrap_or(&NULL),
            _ => &NULL,
        }
    }
    fn num(&self) -> f64 {
        match self {
            Json::Num(x) => *x,
            other => panic!("expected a number, got {other:?}"),
        }
    }
    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            other => panic!("expected a string, got {other:?}"),
        }
    }
    fn arr(&self) -> &Vec<Json> {
        match self {
            Json::Arr(v) => v,
            other => panic!("expected an array, got {other:?}"),
        }
    }
    fn ints(&self) -> Vec<i64> {
        self.arr().iter().map(|x| x.num() as i64).collect()
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(x) => {
                assert!(x.is_finite(), "JSON has no NaN / Infinity");
                if x.fract() == 0.0 && x.abs() < 1e15 {
                    write!(out, "{}", *x as i64).unwrap();
                } else {
                    write!(out, "{x:?}").unwrap(); // shortest repr that reads back exactly
                }
            }
            Json::Str(s) => {
                out.push('"');
                for c in s.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32).unwrap(),
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
            Json::Arr(v) => {
                out.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    x.write(out);
                }
                out.push(']');
            }
            Json::Obj(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    Json::Str(k.clone()).write(out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
    fn dump(&self) -> String {
        let mut s = String::new();
        self.write(&mut s);
        s
    }
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn parse(text: &'a str) -> Result<Json, String> {
        let mut p = Parser { b: text.as_bytes(), i: 0 };
        let v = p.value()?;
        p.ws();
        if p.i != p.b.len() {
            return Err(format!("trailing data at byte {}", p.i));
        }
        Ok(v)
    }
    fn ws(&mut self) {
        while self.i < self.b.len() && b" \t\r\n".contains(&self.b[self.i]) {
            self.i += 1;
        }
    }
    fn eat(&mut self, lit: &str) -> Result<(), String> {
        if self.b[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(format!("expected {lit} at byte {}", self.i))
        }
    }
    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.b.get(self.i) {
            None => Err("unexpected end".into()),
            Some(b'n') => self.eat("null").map(|_| Json::Null),
            Some(b't') => self.eat("true").map(|_| Json::Bool(true)),
            Some(b'f') => self.eat("false").map(|_| Json::Bool(false)),
            Some(b'"') => self.string().map(Json::Str),
            Some(b'[') => {
                self.i += 1;
                let mut v = Vec::new();
                self.ws();
                if self.b.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Arr(v));
                }
                loop {
                    v.push(self.value()?);
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Arr(v));
                        }
                        _ => return Err(format!("expected , or ] at byte {}", self.i)),
                    }
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut m = BTreeMap::new();
                self.ws();
                if self.b.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(m));
                }
                loop {
                    self.ws();
                    let k = self.string()?;
                    self.ws();
                    self.eat(":")?;
                    let v = self.value()?;
                    m.insert(k, v);
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Obj(m));
                        }
                        _ => return Err(format!("expected , or }} at byte {}", self.i)),
                    }
                }
            }
            Some(_) => {
                let start = self.i;
                while self.i < self.b.len() && b"+-0123456789.eE".contains(&self.b[self.i]) {
                    self.i += 1;
                }
                let s = std::str::from_utf8(&self.b[start..self.i]).unwrap();
                s.parse::<f64>().map(Json::Num).map_err(|_| format!("bad number {s:?} at byte {start}"))
            }
        }
    }
    fn hex4(&mut self) -> Result<u32, String> {
        let s = std::str::from_utf8(self.b.get(self.i..self.i + 4).ok_or("short \\u escape")?)
            .map_err(|e| e.to_string())?;
        self.i += 4;
        u32::from_str_radix(s, 16).map_err(|e| e.to_string())
    }
    fn string(&mut self) -> Result<String, String> {
        self.eat("\"")?;
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.b.len() && self.b[self.i] != b'"' && self.b[self.i] != b'\\' {
                self.i += 1;
            }
            out.push_str(std::str::from_utf8(&self.b[start..self.i]).map_err(|e| e.to_string())?);
            match self.b.get(self.i) {
                None => return Err("unterminated string".into()),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                _ => {
                    self.i += 1;
                    let c = *self.b.get(self.i).ok_or("unterminated escape")?;
                    self.i += 1;
                    match c {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let mut code = self.hex4()?;
                            if (0xD800..0xDC00).contains(&code) && self.b[self.i..].starts_with(b"\\u") {
                                self.i += 2;
                                let low = self.hex4()?;
                                code = 0x10000 + ((code - 0xD800) << 10) + (low.wrapping_sub(0xDC00) & 0x3FF);
                            }
                            out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
                        }
                        _ => return Err(format!("bad escape at byte {}", self.i)),
                    }
                }
            }
        }
    }
}

fn obj(pairs: Vec<(&str, Json)>) -> Json {
    Json::Obj(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}
fn s(x: &str) -> Json {
    Json::Str(x.to_string())
}
fn n(x: f64) -> Json {
    Json::Num(x)
}
fn ints(v: &[i64]) -> Json {
    Json::Arr(v.iter().map(|&x| Json::Num(x as f64)).collect())
}

// ---------------------------------------------------------------------------------- worker

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: i64,
}

impl Worker {
    fn start(python: &str, root: &str) -> Worker {
        let mut child = Command::new(python)
            .args(["-m", "recipes.rlaif_worker", "--log-level", "WARNING"])
            .current_dir(root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the worker");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Worker { child, stdin, stdout, next_id: 1 }
    }

    fn send_line(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }

    fn read_response(&mut self) -> Json {
        let mut line = String::new();
        let got = self.stdout.read_line(&mut line).expect("read a response line");
        assert!(got > 0, "the worker closed stdout");
        let v = Parser::parse(line.trim_end()).unwrap_or_else(|e| panic!("bad JSON from the worker ({e}): {line}"));
        assert_eq!(v.get("jsonrpc").str(), "2.0");
        v
    }

    /// The whole response object of one call (result or error), checked to carry our id.
    fn call_raw(&mut self, method: &str, params: Json) -> Json {
        let id = self.next_id;
        self.next_id += 1;
        let req = obj(vec![("jsonrpc", s("2.0")), ("id", n(id as f64)), ("method", s(method)), ("params", params)]);
        self.send_line(&req.dump());
        let resp = self.read_response();
        assert_eq!(resp.get("id").num() as i64, id, "responses come in request order");
        resp
    }

    fn call(&mut self, method: &str, params: Json) -> Json {
        let resp = self.call_raw(method, params);
        if resp.get("error") != &Json::Null {
            panic!("{method} failed: {}", resp.get("error").dump());
        }
        resp.get("result").clone()
    }
}

// --------------------------------------------------------------------- rewards, advantages

/// Reward computed here, not in the worker: the share of ASCII letters in a completion.
fn reward(text: &str) -> f64 {
    let total = text.chars().count().max(1) as f64;
    text.chars().filter(|c| c.is_ascii_alphabetic()).count() as f64 / total
}

/// GRPO advantages: (r - mean) / (std + 1e-4) within each prompt's group (population std).
fn advantages(rewards: &[f64], group: &[i64]) -> Vec<f64> {
    let mut out = vec![0.0; rewards.len()];
    for (i, gi) in group.iter().enumerate() {
        let members: Vec<f64> = rewards.iter().zip(group).filter(|(_, g)| *g == gi).map(|(r, _)| *r).collect();
        let mean = members.iter().sum::<f64>() / members.len() as f64;
        let var = members.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / members.len() as f64;
        out[i] = (rewards[i] - mean) / (var.sqrt() + 1e-4);
    }
    out
}

/// train_step params from a generate result: prompt + completion rows, their mask, advantages.
fn batch_from(gen: &Json) -> (Json, Vec<f64>) {
    let prompts: Vec<Vec<i64>> = gen.get("prompt_tokens").arr().iter().map(|p| p.ints()).collect();
    let index = gen.get("prompt_index").ints();
    let rewards: Vec<f64> = gen.get("texts").arr().iter().map(|t| reward(t.str())).collect();
    let adv = advantages(&rewards, &index);
    let (mut tokens, mut masks) = (Vec::new(), Vec::new());
    for (i, completion) in gen.get("completion_tokens").arr().iter().enumerate() {
        let prompt = &prompts[index[i] as usize];
        let completion = completion.ints();
        let row: Vec<i64> = prompt.iter().chain(completion.iter()).copied().collect();
        let mask: Vec<i64> = std::iter::repeat(0).take(prompt.len()).chain(std::iter::repeat(1).take(completion.len())).collect();
        tokens.push(ints(&row));
        masks.push(ints(&mask));
    }
    let params = obj(vec![
        ("tokens", Json::Arr(tokens)),
        ("completion_mask", Json::Arr(masks)),
        ("advantages", Json::Arr(adv.iter().map(|&a| n(a)).collect())),
    ]);
    (params, rewards)
}

fn initialize(w: &mut Worker, run_dir: &str) -> Json {
    let init = w.call("initialize", obj(vec![
        ("preset", s("smoke")),
        ("config", obj(vec![("out", s(run_dir))])),
        ("protocol_version", s("1.0")),
    ]));
    assert!(init.get("protocol_version").str().starts_with("1."), "protocol 1.x");
    init
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert!(args.len() == 4, "usage: worker_client <python> <repo root> <run dir>");
    let (python, root, run_dir) = (&args[1], &args[2], &args[3]);
    let prompts = Json::Arr(vec![s("Write a function that adds two numbers."), s("Reverse a string.")]);
    let gen_params = |seed: f64| obj(vec![("prompts", prompts.clone()), ("n", n(4.0)), ("max_tokens", n(16.0)),
                                         ("temperature", n(1.0)), ("seed", n(seed))]);

    let mut w = Worker::start(python, root);
    let init = initialize(&mut w, run_dir);
    let accumulation = init.get("capabilities").get("accumulation").num() as usize;

    // robustness over the real pipe: each bad line gets its error and the worker goes on
    w.send_line("{this is not json");
    let parse = w.read_response();
    assert_eq!(parse.get("error").get("code").num() as i64, -32700);
    let unknown = w.call_raw("no_such_method", obj(vec![]));
    assert_eq!(unknown.get("error").get("code").num() as i64, -32601);
    let wrong = w.call_raw("generate", obj(vec![("prompts", s("not a list"))]));
    assert_eq!(wrong.get("error").get("code").num() as i64, -32602);

    // step 1: generate -> reward (here) -> advantages -> train_step -> save
    let gen1 = w.call("generate", gen_params(11.0));
    let (batch1, rewards1) = batch_from(&gen1);
    assert_eq!(batch1.get("tokens").arr().len() % accumulation, 0);
    std::fs::write(format!("{run_dir}/batch1.json"), batch1.dump()).unwrap();
    let step1 = w.call("train_step", batch1);
    assert_eq!(step1.get("step").num() as i64, 1);
    let saved = w.call("save", obj(vec![("meta", obj(vec![("trainer", s("rust")), ("position", n(1.0))]))]));
    assert_eq!(saved.get("step").num() as i64, 1);

    // the next batch is sampled, then the worker dies before training on it
    let gen2 = w.call("generate", gen_params(12.0));
    let (batch2, rewards2) = batch_from(&gen2);
    std::fs::write(format!("{run_dir}/batch2.json"), batch2.dump()).unwrap();
    w.child.kill().unwrap();
    let status = w.child.wait().unwrap();
    assert!(!status.success(), "killed");

    // a new worker resumes from the checkpoint and trains on
    let mut w = Worker::start(python, root);
    initialize(&mut w, run_dir);
    let loaded = w.call("load", obj(vec![]));
    assert_eq!(loaded.get("step").num() as i64, 1);
    assert_eq!(loaded.get("meta").get("trainer").str(), "rust");
    let step2 = w.call("train_step", batch2);
    assert_eq!(step2.get("step").num() as i64, 2);
    let bye = w.call("shutdown", obj(vec![]));
    assert_eq!(bye.get("step").num() as i64, 2);
    let status = w.child.wait().unwrap();
    assert!(status.success(), "shutdown exits 0");

    let summary = obj(vec![
        ("step1", step1),
        ("step2", step2),
        ("rewards1", Json::Arr(rewards1.into_iter().map(n).collect())),
        ("rewards2", Json::Arr(rewards2.into_iter().map(n).collect())),
        ("texts1", gen1.get("texts").clone()),
        ("loaded", loaded),
    ]);
    println!("{}", summary.dump());
}
