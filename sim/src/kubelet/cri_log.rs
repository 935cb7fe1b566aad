//! The CRI container log file format, written and read like containerd and the kubelet do.
//!
//! One record per line: `<RFC3339Nano timestamp> <stdout|stderr> <F|P> <content>\n`. The
//! runtime writes a full line of output as an `F` record (without its newline) and splits lines
//! longer than [`MAX_RECORD`] or unterminated at the end of output into `P` (partial) records.
//! The kubelet reads records back, re-adding the newline to `F` content only.

use std::io::SeekFrom;

use k8s_openapi::jiff::Timestamp;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::streams::OutStream;

/// Longest content per record; longer lines are split into partial records (containerd's
/// default `max_container_log_line_size`).
pub const MAX_RECORD: usize = 16 * 1024;

/// Longest line the reader accepts; anything longer is not a record we wrote.
pub const MAX_LINE: usize = MAX_RECORD + 128;

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub time: Timestamp,
    pub stream: OutStream,
    /// The content as the kubelet emits it: `F` records end with `\n`, `P` records do not.
    pub content: Vec<u8>,
}

impl OutStream {
    pub fn name(self) -> &'static str {
        match self {
            OutStream::Stdout => "stdout",
            OutStream::Stderr => "stderr",
        }
    }
}

/// The current time as a timestamp.
pub fn now() -> Timestamp {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
    // Both parts are in range for any clock this code will run under.
    Timestamp::new(secs, since_epoch.subsec_nanos() as i32).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Encodes one record. `full` marks a complete line (`F`); `content` has no newline.
pub fn encode(time: Timestamp, stream: OutStream, full: bool, content: &[u8]) -> Vec<u8> {
    // Timestamp's Display is RFC 3339 with trailing zeros of the fraction dropped, which is
    // Go's time.RFC3339Nano for UTC — what containerd writes.
    let head = format!("{time} {} {} ", stream.name(), if full { "F" } else { "P" });
    let mut line = Vec::with_capacity(head.len() + content.len() + 1);
    line.extend_from_slice(head.as_bytes());
    line.extend_from_slice(content);
    line.push(b'\n');
    line
}

/// Decodes one line (with or without its trailing newline).
pub fn parse(line: &[u8]) -> Result<Record, String> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let (Some(ts), Some(stream), Some(tag), Some(rest)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not a CRI log record".into());
    };
    let ts = std::str::from_utf8(ts).map_err(|_| "timestamp is not UTF-8".to_string())?;
    let time: Timestamp = ts
        .parse()
        .map_err(|e| format!("unexpected timestamp {ts:?}: {e}"))?;
    let stream = match stream {
        b"stdout" => OutStream::Stdout,
        b"stderr" => OutStream::Stderr,
        other => {
            return Err(format!(
                "unexpected stream type {:?}",
                String::from_utf8_lossy(other)
            ));
        }
    };
    // Tags may carry more fields after ':' (forward compatibility); the first decides.
    let partial = tag.split(|b| *b == b':').next() == Some(b"P");
    let mut content = rest.to_vec();
    if partial && content.last() == Some(&b'\n') {
        content.pop();
    }
    Ok(Record {
        time,
        stream,
        content,
    })
}

/// The offset where the last `lines` lines of the file start (like upstream
/// `tail.FindTailLineStartIndex`): 0 for a negative count, the file size for 0.
pub async fn tail_start(file: &mut tokio::fs::File, lines: i64) -> std::io::Result<u64> {
    if lines < 0 {
        return Ok(0);
    }
    let size = file.seek(SeekFrom::End(0)).await?;
    if lines == 0 {
        return Ok(size);
    }
    const BLOCK: u64 = 4096;
    let mut buf = vec![0u8; BLOCK as usize];
    let mut end = size;
    let mut found: i64 = 0;
    let mut first_block = true;
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let len = (end - start) as usize;
        file.seek(SeekFrom::Start(start)).await?;
        file.read_exact(&mut buf[..len]).await?;
        for i in (0..len).rev() {
            if buf[i] != b'\n' {
                continue;
            }
            // The newline ending the file closes the last line rather than starting one.
            if first_block && start + i as u64 == size - 1 {
                continue;
            }
            found += 1;
            if found == lines {
                return Ok(start + i as u64 + 1);
            }
        }
        first_block = false;
        end = start;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_parse() {
        let t: Timestamp = "2026-11-21T19:55:01.5Z".parse().unwrap();
        let line = encode(t, OutStream::Stderr, true, b"hello world");
        assert_eq!(line, b"2026-11-21T19:55:01.5Z stderr F hello world\n");
        let rec = parse(&line).unwrap();
        assert_eq!(rec.stream, OutStream::Stderr);
        assert_eq!(rec.content, b"hello world\n");
        assert_eq!(rec.time, t);
        let partial = parse(&encode(t, OutStream::Stdout, false, b"abc")).unwrap();
        assert_eq!(partial.content, b"abc");
    }

    #[test]
    fn parse_rejects_garbage() {
        assert!(parse(b"nonsense").is_err());
        assert!(parse(b"2026-11-21T19:55:01Z stdin F x\n").is_err());
        assert!(parse(b"yesterday stdout F x\n").is_err());
    }

    #[tokio::test]
    async fn tail_start_counts_lines_from_the_end() {
        let dir = std::env::temp_dir().join(format!("cri-log-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("0.log");
        let mut content = Vec::new();
        for i in 0..3000 {
            content.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        std::fs::write(&path, &content).unwrap();
        let mut f = tokio::fs::File::open(&path).await.unwrap();
        let at = tail_start(&mut f, 2).await.unwrap() as usize;
        assert_eq!(&content[at..], b"line 2998\nline 2999\n");
        let at = tail_start(&mut f, 2999).await.unwrap() as usize;
        assert!(content[at..].starts_with(b"line 1\n"));
        assert_eq!(tail_start(&mut f, 5000).await.unwrap(), 0);
        assert_eq!(tail_start(&mut f, 0).await.unwrap(), content.len() as u64);
        assert_eq!(tail_start(&mut f, -1).await.unwrap(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
