//! What the person running the demo sees. On a terminal: one screen redrawn in place, the live
//! `kubectl rollouts get rollout --watch` picture on top and the latest narration below it.
//! Elsewhere (CI logs, a pipe): narration lines, and a plain picture at each milestone.
//! Every narration line also goes to `target/demo/narration.log`.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use super::narration::Voice;

const HOME: &str = "\x1b[H";
const CLEAR_SCREEN: &str = "\x1b[2J";
const CLEAR_LINE_TAIL: &str = "\x1b[K";
const CLEAR_TO_END: &str = "\x1b[J";
const HIDE_CURSOR: &str = "\x1b[?25l";
const SHOW_CURSOR: &str = "\x1b[?25h";
/// How often the terminal's size is asked again (a person may resize the window).
const SIZE_CHECK_INTERVAL: Duration = Duration::from_secs(3);
/// Narration lines kept on screen at the least, however tall the picture is.
const MIN_NOTES_SHOWN: usize = 6;

/// Splits the plugin's `--watch` output into pictures. Each redraw it writes is: cursor home,
/// the lines (each ending in clear-to-end-of-line), clear-to-end-of-screen (cli/src/verbs/get.rs).
#[derive(Default)]
pub struct FrameParser {
    pending: Vec<u8>,
}

impl FrameParser {
    /// Takes more output; returns the newest complete picture in it, if any, as plain lines.
    pub fn push(&mut self, bytes: &[u8]) -> Option<Vec<String>> {
        self.pending.extend_from_slice(bytes);
        let end_marker = CLEAR_TO_END.as_bytes();
        let end = find_last(&self.pending, end_marker)?;
        let frame = &self.pending[..end];
        let start = find_last(frame, HOME.as_bytes()).map_or(0, |at| at + HOME.len());
        let text = String::from_utf8_lossy(&frame[start..]).into_owned();
        self.pending.drain(..end + end_marker.len());
        let mut lines: Vec<String> = strip_escapes(&text)
            .lines()
            .map(|line| line.trim_end().to_string())
            .collect();
        while lines.last().is_some_and(String::is_empty) {
            lines.pop();
        }
        Some(lines)
    }
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// The text without terminal control sequences (ESC [ parameters final-byte).
pub fn strip_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else if c != '\r' {
            out.push(c);
        }
    }
    out
}

/// The first `width` characters of a line.
fn clip(line: &str, width: usize) -> String {
    line.chars().take(width).collect()
}

/// The picture in at most `rows` rows. The tree of ReplicaSets and pods (after the first empty
/// line) is what changes most, so it is kept whole and the summary above it is cut first.
fn fit_picture(picture: &[String], rows: usize) -> Vec<String> {
    if picture.len() <= rows {
        return picture.to_vec();
    }
    let Some(blank) = picture.iter().position(|line| line.trim().is_empty()) else {
        return picture[..rows].to_vec();
    };
    let tree = &picture[blank + 1..];
    let summary_rows = rows.saturating_sub(tree.len()).min(blank);
    // Of the summary, where the Rollout stands says the most: those lines go in first.
    let telling = |line: &String| {
        let key = line.trim_start();
        ["Status:", "Message:", "Step:", "ActualWeight:"]
            .iter()
            .any(|k| key.starts_with(k))
    };
    let mut summary: Vec<usize> = (0..blank).filter(|i| telling(&picture[*i])).collect();
    summary.extend((0..blank).filter(|i| !telling(&picture[*i])));
    summary.truncate(summary_rows);
    summary.sort_unstable();
    summary
        .iter()
        .map(|i| &picture[*i])
        .chain(tree)
        .take(rows)
        .cloned()
        .collect()
}

/// Where a wrapped narration line goes on: under the text, past the time stamp.
const WRAP_INDENT: usize = 10;

/// A line broken into rows of at most `width` characters, at spaces where it can be, each
/// row after the first indented by [`WRAP_INDENT`].
fn wrap(line: &str, width: usize) -> Vec<String> {
    let mut rows = Vec::new();
    let mut rest: Vec<char> = line.chars().collect();
    let mut indent = 0;
    while indent + rest.len() > width && width > indent + 1 {
        let room = width - indent;
        let cut = rest[..room]
            .iter()
            .rposition(|c| *c == ' ')
            .filter(|at| *at > 0)
            .unwrap_or(room);
        let row: String = rest[..cut].iter().collect();
        rows.push(format!("{}{}", " ".repeat(indent), row.trim_end()));
        rest.drain(..cut);
        while rest.first() == Some(&' ') {
            rest.remove(0);
        }
        indent = WRAP_INDENT;
    }
    rows.push(format!(
        "{}{}",
        " ".repeat(indent),
        rest.iter().collect::<String>()
    ));
    rows
}

fn prefix(voice: Voice) -> &'static str {
    match voice {
        Voice::Story => "▸ ",
        Voice::Controller => "  controller  ",
        Voice::Traffic => "  traffic     ",
    }
}

/// Rows and columns of the controlling terminal, from `stty size`.
fn terminal_size() -> Option<(usize, usize)> {
    let tty = File::open("/dev/tty").ok()?;
    let output = std::process::Command::new("stty")
        .arg("size")
        .stdin(tty)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let mut numbers = text.split_whitespace().map(str::parse::<usize>);
    match (numbers.next()?, numbers.next()?) {
        (Ok(rows), Ok(cols)) if rows > 0 && cols > 0 => Some((rows, cols)),
        _ => None,
    }
}

/// The live screen's state.
struct Live {
    title: String,
    picture_title: String,
    picture: Vec<String>,
    notes: Vec<String>,
    size: (usize, usize),
    size_checked: Instant,
}

impl Live {
    fn draw(&mut self) {
        if self.size_checked.elapsed() >= SIZE_CHECK_INTERVAL {
            self.size = terminal_size().unwrap_or(self.size);
            self.size_checked = Instant::now();
        }
        let (rows, cols) = self.size;
        let rule = |title: &str| {
            let head = format!("── {title} ");
            let fill = cols.saturating_sub(head.chars().count());
            format!("{head}{}", "─".repeat(fill))
        };
        // Title, two rules, and a last row left empty so the screen never scrolls.
        let room = rows.saturating_sub(4);
        let note_rows: Vec<String> = self.notes.iter().flat_map(|n| wrap(n, cols)).collect();
        let picture_rows = self
            .picture
            .len()
            .min(room.saturating_sub(MIN_NOTES_SHOWN.min(note_rows.len())));
        let shown_notes = room.saturating_sub(picture_rows).min(note_rows.len());
        let mut lines = vec![self.title.clone(), rule(&self.picture_title)];
        lines.extend(fit_picture(&self.picture, picture_rows));
        lines.push(rule("what the demo sees happen"));
        lines.extend(note_rows[note_rows.len() - shown_notes..].iter().cloned());
        let mut text = String::from(HOME);
        for line in &lines {
            text.push_str(&clip(line, cols));
            text.push_str(CLEAR_LINE_TAIL);
            text.push('\n');
        }
        text.push_str(CLEAR_TO_END);
        let mut out = std::io::stdout().lock();
        // A terminal that went away leaves nothing to show; the demo itself goes on.
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    }
}

/// Where narration and pictures go.
pub struct Screen {
    live: Option<Live>,
    started: Instant,
    log: Option<File>,
    /// The demo's own account (no commands, events or rates), repeated when a live screen is
    /// handed back: by then most of it has scrolled out of the narration's few rows.
    recap: Vec<String>,
}

impl Screen {
    /// A live screen when `live`, else plain lines; narration is also appended to `log`.
    pub fn new(live: bool, title: &str, log: &Path) -> Screen {
        let live = live.then(|| {
            print!("{HIDE_CURSOR}{CLEAR_SCREEN}");
            Live {
                title: title.to_string(),
                picture_title:
                    "kubectl rollouts get rollout --watch (starts once the Rollout exists)"
                        .to_string(),
                picture: Vec::new(),
                notes: Vec::new(),
                size: terminal_size().unwrap_or((40, 120)),
                size_checked: Instant::now(),
            }
        });
        if live.is_none() {
            println!("{title}");
        }
        let mut screen = Screen {
            live,
            started: Instant::now(),
            log: File::create(log).ok(),
            recap: Vec::new(),
        };
        screen.redraw();
        screen
    }

    pub fn is_live(&self) -> bool {
        self.live.is_some()
    }

    fn redraw(&mut self) {
        if let Some(live) = &mut self.live {
            live.draw();
        }
    }

    /// One narration line, stamped with the time since the demo started.
    pub fn say(&mut self, voice: Voice, text: &str) {
        let elapsed = self.started.elapsed().as_secs();
        let line = format!(
            "[{:>2}:{:02}] {}{text}",
            elapsed / 60,
            elapsed % 60,
            prefix(voice)
        );
        if let Some(log) = &mut self.log {
            // The log is a convenience: a full disk must not stop the demo.
            let _ = writeln!(log, "{line}");
        }
        match &mut self.live {
            Some(live) => {
                if voice == Voice::Story && !text.starts_with("$ ") {
                    self.recap.push(line.clone());
                }
                live.notes.push(line);
                live.draw();
            }
            None => println!("{line}"),
        }
    }

    /// The live picture's title and content (live screen only).
    pub fn show_picture(&mut self, title: &str, lines: Vec<String>) {
        if let Some(live) = &mut self.live {
            live.picture_title = title.to_string();
            live.picture = lines;
            live.draw();
        }
    }

    /// A picture printed as plain lines (no live screen): a snapshot at a milestone.
    pub fn print_picture(&mut self, lines: &[String]) {
        if self.live.is_none() {
            for line in lines {
                println!("    │ {line}");
            }
        }
    }

    /// Hands the terminal back: the last screen stays, the cursor shows again below it.
    pub fn finish(&mut self) {
        if let Some(live) = &mut self.live {
            live.draw();
            println!(
                "{SHOW_CURSOR}\nWhat happened (every line, events and rates too, is in narration.log):"
            );
            for line in self.recap.drain(..) {
                println!("{line}");
            }
            let _ = std::io::stdout().flush();
        }
        self.live = None;
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two redraws as `get rollout --watch` writes them, split across reads.
    #[test]
    fn the_newest_complete_picture_is_taken_from_the_watch_output() {
        let mut parser = FrameParser::default();
        assert_eq!(parser.push(b"\x1b[?25l\x1b[HName: web\x1b[K\nStat"), None);
        assert_eq!(
            parser.push("us: ✔ Healthy\x1b[K\n\x1b[J".as_bytes()),
            Some(vec![
                "Name: web".to_string(),
                "Status: ✔ Healthy".to_string()
            ])
        );
        let two = "\x1b[HA\x1b[K\n\x1b[J\x1b[HB\x1b[K\n\x1b[J\x1b[HC";
        assert_eq!(parser.push(two.as_bytes()), Some(vec!["B".to_string()]));
        assert_eq!(parser.push(b"\x1b[K\n\x1b[J"), Some(vec!["C".to_string()]));
    }

    #[test]
    fn colours_and_cursor_moves_are_removed() {
        assert_eq!(
            strip_escapes("\x1b[32m✔\x1b[0m Healthy\x1b[K\r"),
            "✔ Healthy"
        );
    }

    #[test]
    fn narration_wraps_at_spaces_under_its_text() {
        assert_eq!(
            wrap("[ 0:01] ▸ canary at 20% and more words", 20),
            [
                "[ 0:01] ▸ canary at",
                "          20% and",
                "          more words"
            ]
        );
        assert_eq!(wrap("short", 20), ["short"]);
        assert_eq!(
            wrap("abcdefghijklmnopqrstuvwxyz", 12),
            [
                "abcdefghijkl",
                "          mn",
                "          op",
                "          qr",
                "          st",
                "          uv",
                "          wx",
                "          yz"
            ]
        );
    }

    #[test]
    fn a_picture_too_tall_keeps_its_tree_and_cuts_the_summary() {
        let picture: Vec<String> = [
            "Name: web",
            "Status: Paused",
            "Step: 1/3",
            "",
            "NAME",
            "web",
            "pod",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(fit_picture(&picture, 7), picture);
        assert_eq!(
            fit_picture(&picture, 5),
            ["Status: Paused", "Step: 1/3", "NAME", "web", "pod"]
        );
        assert_eq!(fit_picture(&picture, 2), ["NAME", "web"]);
    }

    #[test]
    fn lines_are_clipped_by_characters_not_bytes() {
        assert_eq!(clip("└──⧉ web", 4), "└──⧉");
    }
}
