/* The live view of a launch, shared by `hearsay launch` (peers) and `hearsay launch -- COMMAND`
 * (a user's script): the nodes' metrics files RUN_DIR/peer-*.jsonl, followed as they grow,
 * drawn as a table on a terminal or a line per refresh in a log, and plotted at the end. */
#ifndef HS_CLI_LAUNCH_VIEW_H
#define HS_CLI_LAUNCH_VIEW_H

/* One metrics file as last read. */
typedef struct hs__lview_peer {
    char file[512];
    long off;
    int id;
    double round, epoch, loss, acc, mb, rate, consensus, time;
    int done, diverged;
    double final_acc, diverged_round;
    long long bytes;
    char reason[400], advice[256];
} hs__lview_peer;

/* Finds the metrics files that appeared in dir (up to cap in pv), reads what was appended to
 * each since the last call, and sorts them by peer id. */
int hs__lview_scan(const char *dir, hs__lview_peer *pv, int *npv, int cap);
/* Draws the view over the `drawn` lines drawn last (tty), or one line (not a tty); returns the
 * lines drawn. running: processes still alive, so that a death shows at once (a dead peer's
 * metrics file stays). */
int hs__lview_draw(const hs__lview_peer *pv, int npv, int n, int running, int tty, int drawn,
                   double wall);
/* Runs tools/plot on dir (found through HEARSAY_PLOT, the source tree or beside the binary),
 * saying where the plots are or why there are none. */
void hs__lview_plot(const char *dir);

#endif
