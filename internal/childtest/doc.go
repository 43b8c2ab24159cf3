// Package childtest runs a test binary as child processes that talk in lines: a child prints
// what it did on stdout, one line at a time, and reads what to do next on stdin. The fault
// tests of Big Memory and Share Memory start their ranks this way.
package childtest
