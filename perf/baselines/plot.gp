# Bus bandwidth against size, log-log, one panel per collective and rank
# count, from the .dat files summarize.py writes (columns: size, then one
# per library, "-" where it has no figure). Run by summarize.py as
#   gnuplot -e "datadir='D'; panels='allreduce_2 allgather_2'; ncols=1; output='busbw.png'; bound=5.1" plot.gp
# bound (GB/s, 0 for none) is the memory limit of a 2-rank AllReduce, drawn
# in that panel only since it is derived for it alone.
if (!exists("datadir") || !exists("panels") || !exists("output")) {
  print "plot.gp: set datadir, panels and output with -e"
  exit status 2
}
if (!exists("ncols")) ncols = 1
if (!exists("bound")) bound = 0
np = words(panels)
nrows = (np + ncols - 1) / ncols

set terminal pngcairo size 520 * ncols, 400 * nrows font ",9" noenhanced
set output output
set multiplot layout nrows, ncols
set logscale x 2
set logscale y
set xtics 32
set datafile missing "-"
set key right bottom spacing 0.9
set grid
set xlabel "size (bytes)"
set ylabel "busbw (GB/s)"
set format x "%.0b%B"
set format y "%g"

do for [i = 1:np] {
  p = word(panels, i)
  k = strstrt(p, "_")
  coll = p[1:k - 1]
  n = p[k + 1:]
  set title sprintf("%s, %s ranks", coll, n)
  file = datadir . "/" . p . ".dat"
  if (bound > 0 && p eq "allreduce_2") {
    plot for [c = 2:6] file using 1:c with linespoints pt c lt c title columnhead(c), \
         bound with lines dt 2 lc rgb "gray40" title sprintf("memcpy bound %.2f", bound)
  } else {
    plot for [c = 2:6] file using 1:c with linespoints pt c lt c title columnhead(c)
  }
}
unset multiplot
