package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// TokenEnv is the environment variable that may hold the dashboard token.
const TokenEnv = "REGEN_WEB_TOKEN"

const tokenCookie = "regen_token"

// ErrTokenRequired is returned for a non-loopback bind without a token.
var ErrTokenRequired = errors.New("a dashboard on a non-loopback address needs a token (--token or " + TokenEnv + ")")

// CheckBind refuses to expose the dashboard beyond this machine without a
// token. An empty host ("":8080) listens on every interface.
func CheckBind(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("web address %q: %w", addr, err)
	}
	if token != "" || isLoopbackHost(host) {
		return nil
	}
	return fmt.Errorf("web address %s: %w", addr, ErrTokenRequired)
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// requireToken lets a request through only with the token. A browser
// visits ?token=... once; the answer sets an HttpOnly cookie and redirects
// to the same page without the token, so it stays out of history and
// Referer headers.
func requireToken(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	match := func(got string) bool {
		// Hashing first makes the compare constant-time in the length too.
		h := sha256.Sum256([]byte(got))
		return got != "" && subtle.ConstantTimeCompare(h[:], want[:]) == 1
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bearer, ok := bearerToken(r.Header.Get("Authorization")); ok && match(bearer) {
			next.ServeHTTP(w, r)
			return
		}
		if c, err := r.Cookie(tokenCookie); err == nil && match(c.Value) {
			next.ServeHTTP(w, r)
			return
		}
		if q := r.URL.Query(); match(q.Get("token")) {
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			q.Del("token")
			u := *r.URL
			u.RawQuery = q.Encode()
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="regen"`)
		http.Error(w, "401 unauthorized: this dashboard needs its token (open it once with ?token=..., or send Authorization: Bearer)", http.StatusUnauthorized)
	})
}

// bearerToken is the token of an Authorization header in the Bearer
// scheme, whose name is case-insensitive (RFC 9110 §11.1): "bearer T" and
// "BEARER T" count as "Bearer T".
func bearerToken(h string) (string, bool) {
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimLeft(token, " "), true
}

// URL says where a dashboard listening on a can be opened. A wildcard bind
// (0.0.0.0, ::) gets the loopback URL and a note that it listens on every
// interface, with the host's name for other machines: http://[::]:P/ is
// not an address a browser elsewhere can use.
func URL(a net.Addr, hostname string) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return "http://" + a.String() + "/"
	}
	port := strconv.Itoa(tcp.Port)
	u := "http://" + net.JoinHostPort("127.0.0.1", port) + "/ (listening on all interfaces"
	if hostname != "" {
		u += "; from other machines http://" + net.JoinHostPort(hostname, port) + "/"
	}
	return u + ")"
}

// loopbackHostOnly guards a token-less loopback dashboard against DNS
// rebinding: a page elsewhere that resolves its own name to 127.0.0.1
// sends its own Host header, which is refused here.
func loopbackHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if !isLoopbackHost(host) {
			http.Error(w, "403 forbidden: this dashboard answers only to loopback host names", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// readOnly refuses every method that could change something.
func readOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "405 method not allowed: the dashboard is read-only", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'")
		next.ServeHTTP(w, r)
	})
}
