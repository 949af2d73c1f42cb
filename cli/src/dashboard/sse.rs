//! Server-sent events as the browser's `EventSource` reads them: `event:` names the message,
//! each line of the payload is its own `data:` line, and a blank line ends the message.

/// One message of an `text/event-stream` body.
pub fn encode(event: &str, data: &str) -> String {
    let mut message = String::with_capacity(data.len() + event.len() + 16);
    // A name with a line break would end the field early; it never comes from data, but the
    // encoder keeps the stream well-formed whatever it is given.
    let event: String = event.chars().filter(|c| *c != '\n' && *c != '\r').collect();
    message.push_str("event: ");
    message.push_str(&event);
    message.push('\n');
    // A "\r\n" break is one break, as EventSource reads it.
    for line in data
        .split('\n')
        .map(|line| line.strip_suffix('\r').unwrap_or(line))
    {
        message.push_str("data: ");
        message.push_str(line);
        message.push('\n');
    }
    message.push('\n');
    message
}

/// A comment line: ignored by the browser, it keeps idle proxies and the connection open and
/// tells the server early that the page has gone.
pub fn keep_alive() -> &'static str {
    ": keep-alive\n\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_line_message_has_its_name_one_data_line_and_a_blank_line() {
        assert_eq!(
            encode("row", "<tr></tr>"),
            "event: row\ndata: <tr></tr>\n\n"
        );
    }

    #[test]
    fn each_line_of_the_payload_is_its_own_data_line() {
        assert_eq!(
            encode("live", "<pre>\na\r\nb\n</pre>"),
            "event: live\ndata: <pre>\ndata: a\ndata: b\ndata: </pre>\n\n"
        );
    }

    #[test]
    fn an_empty_payload_is_one_empty_data_line() {
        assert_eq!(encode("remove", ""), "event: remove\ndata: \n\n");
    }

    #[test]
    fn a_line_break_in_the_name_cannot_end_the_message_early() {
        assert_eq!(encode("a\nb", "x"), "event: ab\ndata: x\n\n");
    }

    #[test]
    fn keep_alive_is_a_comment() {
        assert!(keep_alive().starts_with(':'));
        assert!(keep_alive().ends_with("\n\n"));
    }
}
