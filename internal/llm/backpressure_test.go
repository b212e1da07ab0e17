package llm

import (
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		header map[string]string
		want   time.Duration
		wantOK bool
	}{
		{"absent", nil, 0, false},
		{"delay-seconds", map[string]string{"Retry-After": "2"}, 2 * time.Second, true},
		{"zero", map[string]string{"Retry-After": "0"}, 0, true},
		{"spaces around", map[string]string{"Retry-After": " 120 "}, 2 * time.Minute, true},
		{"huge is capped", map[string]string{"Retry-After": "99999999999999999999999"}, maxRetryAfter, true},
		{"negative is not delay-seconds", map[string]string{"Retry-After": "-5"}, 0, false},
		{"fraction is not delay-seconds", map[string]string{"Retry-After": "1.5"}, 0, false},
		{"garbage", map[string]string{"Retry-After": "soon"}, 0, false},
		{"IMF-fixdate", map[string]string{"Retry-After": "Fri, 04 Dec 2026 01:00:30 GMT"}, 30 * time.Second, true},
		{"RFC 850 date", map[string]string{"Retry-After": "Friday, 04-Dec-26 01:01:00 GMT"}, time.Minute, true},
		{"asctime date", map[string]string{"Retry-After": "Fri Dec  4 01:00:05 2026"}, 5 * time.Second, true},
		{"date in the past", map[string]string{"Retry-After": "Fri, 04 Dec 2026 00:59:00 GMT"}, 0, true},
		// The server's own Date is the reference, so a skewed local clock
		// does not change the wait.
		{"date relative to the server's Date", map[string]string{
			"Retry-After": "Fri, 04 Dec 2026 03:00:10 GMT", "Date": "Fri, 04 Dec 2026 03:00:00 GMT"}, 10 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.header {
				h.Set(k, v)
			}
			got, ok := retryAfter(h, now)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("retryAfter(%v) = %v, %v; want %v, %v", tt.header, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// TestChatBackpressure: 429, and 503 with Retry-After, come back as
// Backpressure with the server's Retry-After; 503 without it stays an
// outage.
func TestChatBackpressure(t *testing.T) {
	date := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(http.TimeFormat) }
	tests := []struct {
		name       string
		status     int
		retryAfter string
		body       string
		want       *Error
		minWait    time.Duration // for HTTP-date answers, which depend on the clock
	}{
		{name: "429 with delay-seconds", status: 429, retryAfter: "2", body: `{"error":{"message":"Too Many Requests","code":429}}`,
			want: &Error{Class: Backpressure, Status: 429, Msg: "Too Many Requests", RetryAfter: 2 * time.Second}},
		{name: "429 without Retry-After", status: 429, body: `{"error":{"message":"slow down"}}`,
			want: &Error{Class: Backpressure, Status: 429, Msg: "slow down"}},
		{name: "429 with an unreadable Retry-After", status: 429, retryAfter: "later", body: "busy",
			want: &Error{Class: Backpressure, Status: 429, Msg: "busy"}},
		{name: "503 with delay-seconds", status: 503, retryAfter: "7", body: `{"object":"error","message":"overloaded","code":503}`,
			want: &Error{Class: Backpressure, Status: 503, Msg: "overloaded", RetryAfter: 7 * time.Second}},
		{name: "503 with an HTTP-date", status: 503, retryAfter: date(10 * time.Second), body: "overloaded",
			want: &Error{Class: Backpressure, Status: 503, Msg: "overloaded"}, minWait: 8 * time.Second},
		{name: "503 without Retry-After", status: 503, body: `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`,
			want: &Error{Class: ServerDown, Status: 503, Msg: "Loading model"}},
		{name: "503 with an unreadable Retry-After", status: 503, retryAfter: "-1", body: "down",
			want: &Error{Class: ServerDown, Status: 503, Msg: "down"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}, Config{})
			_, err := c.Chat(bg(t), testRequest(), nil)
			e, ok := err.(*Error)
			if !ok {
				t.Fatalf("Chat error = %v, want *Error", err)
			}
			got := *e
			if tt.minWait > 0 {
				if got.RetryAfter < tt.minWait || got.RetryAfter > tt.minWait+3*time.Second {
					t.Errorf("RetryAfter = %v, want about %v", got.RetryAfter, tt.minWait+time.Second)
				}
				got.RetryAfter = 0
			}
			if diff := cmp.Diff(tt.want, &got); diff != "" {
				t.Errorf("error mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestChatInStreamError: an error event inside a 200 stream says so, for
// the dispatcher's log, and a 429 among them is backpressure.
func TestChatInStreamError(t *testing.T) {
	for _, code := range []int{429, 500} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			_, c := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				writeEvents(w, `data: {"error":{"message":"busy","code":`+strconv.Itoa(code)+`}}`+"\n\n")
			}, Config{})
			_, err := c.Chat(bg(t), testRequest(), nil)
			e, ok := err.(*Error)
			if !ok || !e.InStream || e.Status != 0 {
				t.Fatalf("Chat error = %#v, want an *Error with InStream set and no HTTP status", err)
			}
			want := map[int]Class{429: Backpressure, 500: Retryable}[code]
			if e.Class != want {
				t.Errorf("class = %v, want %v", e.Class, want)
			}
		})
	}
}
