package llm

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"
)

// A server that answers 200 but not with an event stream (a web page, a
// whole JSON completion, nothing at all) is not an OpenAI-compatible chat
// endpoint as configured, or is broken: its errors say what came back and
// carry EndpointFault, so the dispatcher blames the endpoint, never the
// sample.

const msgStreamCut = "chat stream: stream cut before finish_reason"

// mediaType is the response's Content-Type without parameters, lower case;
// "" when absent or unreadable.
func mediaType(h http.Header) string {
	ct := h.Get("Content-Type")
	if ct == "" {
		return ""
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(ct))
	}
	return mt
}

// notAStream reads the start of a 200 body of another media type, as
// evidence, and says what the server sent.
func notAStream(k *call, media string, body io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(body, 512))
	if err != nil && len(b) == 0 && k.parent.Err() != nil {
		return k.fail("chat", err)
	}
	msg := fmt.Sprintf("chat: answered 200 with %s, not an event stream: is this an OpenAI-compatible endpoint?", media)
	if snippet := oneLine(b, 120); snippet != "" {
		msg += " (body starts: " + snippet + ")"
	}
	return &Error{Class: Malformed, EndpointFault: true, Msg: msg}
}

// emptyBody reports whether err is a stream that ended before a single
// byte of body arrived.
func (k *call) emptyBody(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Class == ServerDown && e.Msg == msgStreamCut && k.wd.phase.Load() != phaseStreaming
}

// emptyAnswer is the error for a 200 with no body, naming the size of its
// headers when they were large (a proxy or a misbehaving server).
func emptyAnswer(h http.Header) error {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	what := "an empty body"
	if n > 64<<10 {
		what = fmt.Sprintf("%d KiB of headers and an empty body", n>>10)
	}
	return &Error{Class: ServerDown, EndpointFault: true,
		Msg: fmt.Sprintf("chat: answered 200 with %s, not an event stream: is this an OpenAI-compatible endpoint?", what)}
}

// oneLine is b as printable text on one line, at most n runes.
func oneLine(b []byte, n int) string {
	var sb strings.Builder
	space := false
	for len(b) > 0 && n > 0 {
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		switch {
		case r == utf8.RuneError || r < 0x20 || r == 0x7f || r == ' ':
			space = sb.Len() > 0
			continue
		case space:
			sb.WriteByte(' ')
			space = false
			n--
		}
		sb.WriteRune(r)
		n--
	}
	return sb.String()
}
