// Package ui renders what the runner and `regen status` know for people: a
// live progress block per partition (redrawn in place on a terminal, plain
// periodic lines otherwise), drawn from the frames the runner publishes
// (Progress.Show subscribes to them; the runner never imports ui), and the
// one-screen status report. Rendering is a pure function of a snapshot so
// it can be tested with golden strings; the package never reads the store
// or the network itself.
package ui
