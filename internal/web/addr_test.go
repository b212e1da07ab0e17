package web

import (
	"net"
	"net/http"
	"testing"
)

// TestBearerSchemeAnyCase: the auth scheme name is case-insensitive (RFC
// 9110 §11.1), so "bearer T" opens the dashboard as "Bearer T" does; the
// token itself is compared exactly (issue 21).
func TestBearerSchemeAnyCase(t *testing.T) {
	const token = "s3cret-token"
	srv := newServer(t, token)
	tests := []struct {
		header string
		want   int
	}{
		{"Bearer " + token, http.StatusOK},
		{"bearer " + token, http.StatusOK},
		{"BEARER " + token, http.StatusOK},
		{"bEaReR  " + token, http.StatusOK}, // 1*SP before the token
		{"bearer " + "S3CRET-TOKEN", http.StatusUnauthorized},
		{"bearer wrong", http.StatusUnauthorized},
		{"Basic " + token, http.StatusUnauthorized},
		{"Bearer" + token, http.StatusUnauthorized},
		{"bearer ", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		req := request(t, "GET", srv.URL+"/api/status")
		req.Header.Set("Authorization", tt.header)
		if code, _ := get(t, nil, req); code != tt.want {
			t.Errorf("Authorization: %q: %d, want %d", tt.header, code, tt.want)
		}
	}
}

// TestURLOfWildcardBind: a dashboard bound to every interface prints a URL
// a browser can open, not http://[::]:P/ (issue 21).
func TestURLOfWildcardBind(t *testing.T) {
	tests := []struct {
		name string
		addr net.Addr
		host string
		want string
	}{
		{"loopback", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}, "gpu1", "http://127.0.0.1:8080/"},
		{"ipv6 loopback", &net.TCPAddr{IP: net.IPv6loopback, Port: 8080}, "gpu1", "http://[::1]:8080/"},
		{"an interface", &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 8080}, "gpu1", "http://10.1.2.3:8080/"},
		{"0.0.0.0", &net.TCPAddr{IP: net.IPv4zero, Port: 8080}, "gpu1",
			"http://127.0.0.1:8080/ (listening on all interfaces; from other machines http://gpu1:8080/)"},
		{"::", &net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}, "gpu1",
			"http://127.0.0.1:8080/ (listening on all interfaces; from other machines http://gpu1:8080/)"},
		{"no host name", &net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}, "", "http://127.0.0.1:8080/ (listening on all interfaces)"},
	}
	for _, tt := range tests {
		if got := URL(tt.addr, tt.host); got != tt.want {
			t.Errorf("%s: URL(%v) = %q, want %q", tt.name, tt.addr, got, tt.want)
		}
	}
}
